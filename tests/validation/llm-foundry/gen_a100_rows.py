#!/usr/bin/env python3
"""gen_a100_rows.py — the A100 rows of llm-foundry's MPT benchmark tables as validation plans.

Usage: gen_a100_rows.py TALLY OUT_DIR

llm-foundry's scripts/train/benchmarking/README.md ("MPT Training Benchmarks", tables "A100
80GB with 1600 Gbps node-node interconnect (RoCE)" and "A100 40GB ..."), below as published:
model, sequence, GPUs, GPU, MFU, HFU, model TFLOP, micro-batch, accumulation, global batch,
samples/s, tokens/s, tokens/s per GPU, global batch in tokens, precision, FSDP mixed-precision
mode, sharding, activation checkpointing, CPU offload, parameters. Each row becomes one plan in
OUT_DIR, written like the hand-written rows beside this script (the MPT the benchmark trains:
learned positions, biases, GeLU MLP of 4d, tied head, vocabulary 50,368), unless a file of
that name exists. A row is written only when tally counts the published parameters exactly
(the learned positions make the count depend on the sequence), so a row cannot silently
describe another model. Its bound is ±30%, the issue's "no row worse than" target, or ±45%
where attention is more than a quarter of the model FLOPs by the README's own MFU formula
(4·layers·d·seq against 2·params per token). Every row of these tables ran MPT's Triton
flash attention (submit_benchmarks.py's default `attn_impl: triton` at the tables' commits,
300cc5c to b2a43a1, 2023), so each plan says `attention_kernel = flash1_triton`: tally prices it
at FlashAttention-2's time times the FlashAttention-2 paper's measured ratios on the A100
(docs/time.md, "Framework stacks"). Nothing is set from the error.
"""
import json
import os
import subprocess
import sys

DIMS = {  # scripts/train/yamls/pretrain/mpt-*.yaml: d_model, n_heads, n_layers
    "125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24),
    "1b": (2048, 16, 24), "3b": (2560, 20, 32), "7b": (4096, 32, 32),
    "13b": (5120, 40, 40), "30b": (7168, 56, 48), "70b": (8192, 64, 80),
}
TABLES = {
    "A100_80GB": "A100 80GB with 1600 Gbps node-node interconnect (RoCE)",
    "A100_40GB": "A100 40GB with 1600 Gbps node-node interconnect (RoCE)",
}
ROWS = """
A100_80GB 70b 2048 64 a100_80gb 53.33 71.1 166 8 4 2048 12 26274 410 4194304 bf16 PURE FULL_SHARD True False 64862437376
A100_80GB 70b 2048 32 a100_80gb 48.56 64.75 151 2 16 1024 5 11962 373 2097152 bf16 PURE FULL_SHARD True False 64862437376
A100_80GB 30b 8192 8 a100_80gb 39.38 52.5 122 1 21 168 0 4594 574 1376256 amp_bf16 DEFAULT FULL_SHARD True False 30019254272
A100_80GB 30b 4096 8 a100_80gb 51.37 68.49 160 1 21 168 1 6513 814 688128 amp_bf16 DEFAULT FULL_SHARD True False 29989894144
A100_80GB 30b 2048 8 a100_80gb 55.3 73.74 172 3 21 504 3 7330 916 1032192 amp_bf16 DEFAULT FULL_SHARD True False 29975214080
A100_80GB 30b 1024 8 a100_80gb 55.82 74.43 174 6 21 1008 7 7571 946 1032192 amp_bf16 DEFAULT FULL_SHARD True False 29967874048
A100_80GB 30b 512 8 a100_80gb 56.4 75.2 175 12 21 2016 15 7739 967 1032192 amp_bf16 DEFAULT FULL_SHARD True False 29964204032
A100_80GB 13b 32768 8 a100_80gb 51.69 68.92 161 1 3 24 0 8134 1016 786432 amp_bf16 DEFAULT FULL_SHARD True False 13011240960
A100_80GB 13b 16384 8 a100_80gb 54.07 72.1 168 3 3 72 0 11454 1431 1179648 amp_bf16 DEFAULT FULL_SHARD True False 12927354880
A100_80GB 13b 8192 8 a100_80gb 56.07 74.76 174 5 3 120 1 14362 1795 983040 amp_bf16 DEFAULT FULL_SHARD True False 12885411840
A100_80GB 13b 4096 8 a100_80gb 57.62 76.82 179 10 3 240 4 16482 2060 983040 amp_bf16 DEFAULT FULL_SHARD True False 12864440320
A100_80GB 13b 2048 8 a100_80gb 59.57 59.57 185 2 3 48 8 18097 2262 98304 amp_bf16 DEFAULT FULL_SHARD False False 12853954560
A100_80GB 13b 1024 8 a100_80gb 59.48 79.3 185 40 3 960 18 18647 2330 983040 amp_bf16 DEFAULT FULL_SHARD True False 12848711680
A100_80GB 7b 65536 8 a100_80gb 46.97 62.63 146 1 2 16 0 8108 1013 1048576 amp_bf16 DEFAULT FULL_SHARD True False 6918905856
A100_80GB 7b 32768 8 a100_80gb 49.46 65.94 154 2 2 32 0 13382 1672 1048576 amp_bf16 DEFAULT FULL_SHARD True False 6784688128
A100_80GB 7b 16384 8 a100_80gb 51.96 69.28 162 4 2 64 1 19629 2453 1048576 amp_bf16 DEFAULT FULL_SHARD True False 6717579264
A100_80GB 7b 8192 8 a100_80gb 54.47 72.62 169 8 2 128 3 25655 3206 1048576 amp_bf16 DEFAULT FULL_SHARD True False 6684024832
A100_80GB 7b 4096 8 a100_80gb 54.84 73.12 171 16 2 256 7 29472 3684 1048576 amp_bf16 DEFAULT FULL_SHARD True False 6667247616
A100_80GB 7b 2048 8 a100_80gb 64.23 64.23 200 6 2 96 18 37130 4641 196608 amp_bf16 DEFAULT FULL_SHARD False False 6658859008
A100_80GB 7b 1024 8 a100_80gb 58.01 77.35 180 64 2 1024 34 34857 4357 1048576 amp_bf16 DEFAULT FULL_SHARD True False 6654664704
A100_80GB 3b 65536 8 a100_80gb 46.05 61.41 143 1 2 16 0 14137 1767 1048576 amp_bf16 DEFAULT FULL_SHARD True False 2814366720
A100_80GB 3b 32768 8 a100_80gb 47.18 62.91 147 3 6 144 0 24235 3029 4718592 amp_bf16 DEFAULT FULL_SHARD True False 2730480640
A100_80GB 3b 16384 8 a100_80gb 57.13 57.13 178 1 6 48 2 44233 5529 786432 amp_bf16 DEFAULT FULL_SHARD False False 2688537600
A100_80GB 3b 8192 8 a100_80gb 59.34 59.34 185 3 6 144 7 61567 7695 1179648 amp_bf16 DEFAULT FULL_SHARD False False 2667566080
A100_80GB 3b 4096 8 a100_80gb 60.53 60.53 188 5 6 240 18 75658 9457 983040 amp_bf16 DEFAULT FULL_SHARD False False 2657080320
A100_80GB 3b 2048 8 a100_80gb 62.11 62.11 193 10 2 160 42 86491 10811 327680 amp_bf16 DEFAULT FULL_SHARD False False 2651837440
A100_80GB 3b 1024 8 a100_80gb 62.73 62.73 195 20 6 960 90 92643 11580 983040 amp_bf16 DEFAULT FULL_SHARD False False 2649216000
A100_80GB 3b 512 8 a100_80gb 63.71 63.71 198 40 6 1920 189 97019 12127 983040 amp_bf16 DEFAULT FULL_SHARD False False 2647905280
A100_80GB 1b 65536 8 a100_80gb 46.18 61.57 144 1 2 16 0 24353 3044 1048576 amp_bf16 DEFAULT FULL_SHARD True False 1445974016
A100_80GB 1b 32768 8 a100_80gb 55.52 55.52 173 1 4 32 1 50207 6275 1048576 amp_bf16 DEFAULT FULL_SHARD False False 1378865152
A100_80GB 1b 16384 8 a100_80gb 56.6 56.6 176 2 4 64 4 79650 9956 1048576 amp_bf16 DEFAULT FULL_SHARD False False 1345310720
A100_80GB 1b 8192 8 a100_80gb 56.69 56.69 176 3 4 96 13 110516 13814 786432 amp_bf16 DEFAULT FULL_SHARD False False 1328533504
A100_80GB 1b 4096 8 a100_80gb 59.0 59.0 184 7 4 224 34 142457 17807 917504 amp_bf16 DEFAULT FULL_SHARD False False 1320144896
A100_80GB 1b 2048 8 a100_80gb 59.86 59.86 186 14 4 448 80 164109 20513 917504 amp_bf16 DEFAULT FULL_SHARD False False 1315950592
A100_80GB 1b 1024 8 a100_80gb 60.15 60.15 187 18 4 576 172 176898 22112 589824 amp_bf16 DEFAULT FULL_SHARD False False 1313853440
A100_80GB 1b 512 8 a100_80gb 60.68 60.68 189 56 4 1792 361 185186 23148 917504 amp_bf16 DEFAULT FULL_SHARD False False 1312804864
A100_80GB 760m 65536 8 a100_80gb 45.34 60.45 141 1 2 16 0 33150 4143 1048576 amp_bf16 DEFAULT FULL_SHARD True False 857988096
A100_80GB 760m 32768 8 a100_80gb 54.57 54.57 170 1 2 16 2 70417 8802 524288 amp_bf16 DEFAULT FULL_SHARD False False 807656448
A100_80GB 760m 16384 8 a100_80gb 54.64 54.64 170 3 2 48 6 114198 14274 786432 amp_bf16 DEFAULT FULL_SHARD False False 782490624
A100_80GB 760m 8192 8 a100_80gb 55.31 55.31 172 6 2 96 20 167471 20933 786432 amp_bf16 DEFAULT FULL_SHARD False False 769907712
A100_80GB 760m 4096 8 a100_80gb 56.05 56.05 174 12 2 192 53 218808 27351 786432 amp_bf16 DEFAULT FULL_SHARD False False 763616256
A100_80GB 760m 2048 8 a100_80gb 56.85 56.85 177 24 2 384 126 259472 32434 786432 amp_bf16 DEFAULT FULL_SHARD False False 760470528
A100_80GB 760m 1024 8 a100_80gb 47.76 47.76 149 48 2 768 232 238122 29765 786432 amp_bf16 DEFAULT FULL_SHARD False False 758897664
A100_80GB 760m 512 8 a100_80gb 45.07 45.07 140 96 2 1536 460 235571 29446 786432 amp_bf16 DEFAULT FULL_SHARD False False 758111232
A100_80GB 350m 65536 8 a100_80gb 52.7 52.7 164 1 2 16 0 60195 7524 1048576 amp_bf16 DEFAULT FULL_SHARD False False 420997120
A100_80GB 350m 32768 8 a100_80gb 52.46 52.46 163 2 2 32 3 109222 13652 1048576 amp_bf16 DEFAULT FULL_SHARD False False 387442688
A100_80GB 350m 16384 8 a100_80gb 53.28 53.28 166 4 2 64 11 188478 23559 1048576 amp_bf16 DEFAULT FULL_SHARD False False 370665472
A100_80GB 350m 8192 8 a100_80gb 53.8 53.8 167 8 2 128 35 292559 36569 1048576 amp_bf16 DEFAULT FULL_SHARD False False 362276864
A100_80GB 350m 4096 8 a100_80gb 53.31 53.31 166 16 2 256 96 396442 49555 1048576 amp_bf16 DEFAULT FULL_SHARD False False 358082560
A100_80GB 350m 2048 8 a100_80gb 51.62 51.62 161 32 2 512 229 470263 58782 1048576 amp_bf16 DEFAULT FULL_SHARD False False 355985408
A100_80GB 350m 1024 8 a100_80gb 50.51 50.51 157 64 2 1024 506 518504 64813 1048576 amp_bf16 DEFAULT FULL_SHARD False False 354936832
A100_80GB 350m 512 8 a100_80gb 50.61 50.61 157 128 2 2048 1083 554643 69330 1048576 amp_bf16 DEFAULT FULL_SHARD False False 354412544
A100_80GB 125m 65536 8 a100_80gb 54.13 54.13 168 1 2 16 2 162946 20368 1048576 amp_bf16 DEFAULT FULL_SHARD False False 174070272
A100_80GB 125m 32768 8 a100_80gb 52.71 52.71 164 2 2 32 8 291256 36407 1048576 amp_bf16 DEFAULT FULL_SHARD False False 148904448
A100_80GB 125m 16384 8 a100_80gb 50.61 50.61 157 4 2 64 29 480322 60040 1048576 amp_bf16 DEFAULT FULL_SHARD False False 136321536
A100_80GB 125m 8192 8 a100_80gb 48.85 48.85 152 8 2 128 88 723142 90392 1048576 amp_bf16 DEFAULT FULL_SHARD False False 130030080
A100_80GB 125m 4096 8 a100_80gb 46.08 46.08 143 16 2 256 231 947172 118396 1048576 amp_bf16 DEFAULT FULL_SHARD False False 126884352
A100_80GB 125m 2048 8 a100_80gb 44.79 44.79 139 40 2 640 557 1142641 142830 1310720 amp_bf16 DEFAULT FULL_SHARD False False 125311488
A100_80GB 125m 2048 8 a100_80gb 44.45 44.45 138 32 2 512 553 1133901 141737 1048576 amp_bf16 DEFAULT FULL_SHARD False False 125311488
A100_80GB 125m 1024 8 a100_80gb 43.15 43.15 134 64 2 1024 1222 1251751 156468 1048576 amp_bf16 DEFAULT FULL_SHARD False False 124525056
A100_80GB 125m 512 8 a100_80gb 42.56 42.56 132 128 2 2048 2588 1325455 165681 1048576 amp_bf16 DEFAULT FULL_SHARD False False 124131840
A100_40GB 70b 2048 128 a100_40gb 48.91 65.21 152 4 1 512 23 48194 376 1048576 bf16 PURE FULL_SHARD True False 64862437376
A100_40GB 70b 2048 64 a100_40gb 35.87 47.82 111 2 1 128 8 17672 276 262144 bf16 PURE FULL_SHARD True False 64862437376
A100_40GB 30b 2048 128 a100_40gb 52.25 69.66 163 6 1 768 54 110803 865 1572864 bf16 PURE FULL_SHARD True False 29975214080
A100_40GB 30b 2048 32 a100_40gb 51.74 68.98 161 4 1 128 13 27431 857 262144 bf16 PURE FULL_SHARD True False 29975214080
A100_40GB 13b 8192 8 a100_40gb 43.95 58.6 137 1 16 128 1 11258 1407 1048576 bf16 PURE FULL_SHARD True False 12885411840
A100_40GB 13b 4096 8 a100_40gb 44.85 59.8 139 2 16 256 3 12830 1603 1048576 bf16 PURE FULL_SHARD True False 12864440320
A100_40GB 13b 2048 128 a100_40gb 51.93 69.24 162 16 1 2048 123 252444 1972 4194304 bf16 PURE FULL_SHARD True False 12853954560
A100_40GB 13b 2048 64 a100_40gb 52.04 69.39 162 16 1 1024 61 126479 1976 2097152 bf16 PURE FULL_SHARD True False 12853954560
A100_40GB 13b 2048 32 a100_40gb 52.62 70.16 164 14 1 448 31 63946 1998 917504 bf16 PURE FULL_SHARD True False 12853954560
A100_40GB 13b 2048 16 a100_40gb 52.5 70.0 163 10 1 160 15 31900 1993 327680 bf16 PURE FULL_SHARD True False 12853954560
A100_40GB 13b 2048 8 a100_40gb 43.94 58.58 137 4 16 512 6 13347 1668 1048576 bf16 PURE FULL_SHARD True False 12853954560
A100_40GB 13b 1024 8 a100_40gb 44.07 58.76 137 8 16 1024 13 13817 1727 1048576 bf16 PURE FULL_SHARD True False 12848711680
A100_40GB 13b 512 8 a100_40gb 44.28 59.04 138 16 16 2048 27 14108 1763 1048576 bf16 PURE FULL_SHARD True False 12846090240
A100_40GB 7b 16384 8 a100_40gb 47.65 63.53 148 1 4 32 1 17998 2249 524288 bf16 PURE FULL_SHARD True False 6717579264
A100_40GB 7b 8192 8 a100_40gb 49.04 65.38 153 3 4 96 2 23098 2887 786432 bf16 PURE FULL_SHARD True False 6684024832
A100_40GB 7b 4096 8 a100_40gb 50.11 66.82 156 6 4 192 6 26930 3366 786432 bf16 PURE FULL_SHARD True False 6667247616
A100_40GB 7b 2048 128 a100_40gb 50.14 66.85 156 18 1 2304 226 463749 3623 4718592 bf16 PURE FULL_SHARD True False 6658859008
A100_40GB 7b 2048 64 a100_40gb 50.73 67.64 158 18 1 1152 114 234614 3665 2359296 bf16 PURE FULL_SHARD True False 6658859008
A100_40GB 7b 2048 32 a100_40gb 51.55 68.73 160 18 1 576 58 119202 3725 1179648 bf16 PURE FULL_SHARD True False 6658859008
A100_40GB 7b 2048 16 a100_40gb 50.44 67.26 157 16 1 256 28 58322 3645 524288 bf16 PURE FULL_SHARD True False 6658859008
A100_40GB 7b 2048 8 a100_40gb 50.92 67.89 158 12 4 384 14 29436 3679 786432 bf16 PURE FULL_SHARD True False 6658859008
A100_40GB 7b 1024 8 a100_40gb 51.31 68.42 160 24 4 768 30 30833 3854 786432 bf16 PURE FULL_SHARD True False 6654664704
A100_40GB 7b 512 8 a100_40gb 50.85 67.8 158 48 4 1536 60 31167 3895 786432 bf16 PURE FULL_SHARD True False 6652567552
A100_40GB 3b 32768 8 a100_40gb 46.03 61.37 143 1 4 32 0 23640 2955 1048576 bf16 PURE FULL_SHARD True False 2730480640
A100_40GB 3b 16384 8 a100_40gb 46.14 61.52 143 2 8 128 2 35726 4465 2097152 bf16 PURE FULL_SHARD True False 2688537600
A100_40GB 3b 8192 8 a100_40gb 55.13 55.13 172 1 8 64 6 57193 7149 524288 bf16 PURE FULL_SHARD False False 2667566080
A100_40GB 3b 4096 8 a100_40gb 56.18 56.18 175 2 8 128 17 70223 8777 524288 bf16 PURE FULL_SHARD False False 2657080320
A100_40GB 3b 2048 128 a100_40gb 54.8 54.8 170 6 1 768 596 1220885 9538 1572864 bf16 PURE FULL_SHARD False False 2651837440
A100_40GB 3b 2048 64 a100_40gb 55.94 55.94 174 6 1 384 304 623167 9736 786432 bf16 PURE FULL_SHARD False False 2651837440
A100_40GB 3b 2048 32 a100_40gb 56.96 56.96 177 6 1 192 154 317261 9914 393216 bf16 PURE FULL_SHARD False False 2651837440
A100_40GB 3b 2048 16 a100_40gb 56.02 56.02 174 5 1 80 76 156013 9750 163840 bf16 PURE FULL_SHARD False False 2651837440
A100_40GB 3b 2048 8 a100_40gb 57.82 57.82 180 5 8 320 39 80520 10065 655360 bf16 PURE FULL_SHARD False False 2651837440
A100_40GB 3b 1024 8 a100_40gb 58.14 58.14 181 10 8 640 83 85854 10731 655360 bf16 PURE FULL_SHARD False False 2649216000
A100_40GB 3b 512 8 a100_40gb 59.49 59.49 185 20 8 1280 176 90596 11324 655360 bf16 PURE FULL_SHARD False False 2647905280
A100_40GB 1b 32768 8 a100_40gb 45.07 60.1 140 1 4 32 1 40762 5095 1048576 bf16 PURE FULL_SHARD True False 1378865152
A100_40GB 1b 16384 8 a100_40gb 55.23 55.23 172 1 8 64 4 77723 9715 1048576 bf16 PURE FULL_SHARD False False 1345310720
A100_40GB 1b 8192 8 a100_40gb 55.29 55.29 172 2 8 128 13 107799 13474 1048576 bf16 PURE FULL_SHARD False False 1328533504
A100_40GB 1b 4096 8 a100_40gb 55.85 55.85 174 4 8 256 32 134851 16856 1048576 bf16 PURE FULL_SHARD False False 1320144896
A100_40GB 1b 2048 128 a100_40gb 54.41 54.41 169 10 1 1280 1165 2386897 18647 2621440 bf16 PURE FULL_SHARD False False 1315950592
A100_40GB 1b 2048 64 a100_40gb 55.44 55.44 172 10 1 640 593 1216104 19001 1310720 bf16 PURE FULL_SHARD False False 1315950592
A100_40GB 1b 2048 32 a100_40gb 45.39 45.39 141 10 1 320 243 497782 15555 655360 bf16 PURE FULL_SHARD False False 1315950592
A100_40GB 1b 2048 16 a100_40gb 55.69 55.69 173 8 1 128 149 305372 19085 262144 bf16 PURE FULL_SHARD False False 1315950592
A100_40GB 1b 2048 8 a100_40gb 56.23 56.23 175 8 8 512 75 154171 19271 1048576 bf16 PURE FULL_SHARD False False 1315950592
A100_40GB 1b 1024 8 a100_40gb 57.02 57.02 177 16 8 1024 163 167677 20959 1048576 bf16 PURE FULL_SHARD False False 1313853440
A100_40GB 1b 512 8 a100_40gb 57.1 57.1 178 32 8 2048 340 174256 21782 1048576 bf16 PURE FULL_SHARD False False 1312804864
A100_40GB 760m 32768 8 a100_40gb 44.53 59.37 138 1 4 32 1 57464 7183 1048576 bf16 PURE FULL_SHARD True False 807656448
A100_40GB 760m 16384 8 a100_40gb 53.26 53.26 166 1 4 32 6 111316 13914 524288 bf16 PURE FULL_SHARD False False 782490624
A100_40GB 760m 8192 8 a100_40gb 53.12 53.12 165 3 4 96 19 160853 20106 786432 bf16 PURE FULL_SHARD False False 769907712
A100_40GB 760m 4096 8 a100_40gb 53.0 53.0 165 6 4 192 50 206909 25863 786432 bf16 PURE FULL_SHARD False False 763616256
A100_40GB 760m 2048 128 a100_40gb 50.73 50.73 158 12 1 1536 1808 3704382 28940 3145728 bf16 PURE FULL_SHARD False False 760470528
A100_40GB 760m 2048 64 a100_40gb 51.44 51.44 160 12 1 768 917 1878030 29344 1572864 bf16 PURE FULL_SHARD False False 760470528
A100_40GB 760m 2048 32 a100_40gb 51.97 51.97 162 12 1 384 463 948745 29648 786432 bf16 PURE FULL_SHARD False False 760470528
A100_40GB 760m 2048 16 a100_40gb 51.9 51.9 161 12 1 192 231 473723 29607 393216 bf16 PURE FULL_SHARD False False 760470528
A100_40GB 760m 2048 8 a100_40gb 52.89 52.89 165 12 4 384 117 241389 30173 786432 bf16 PURE FULL_SHARD False False 760470528
A100_40GB 760m 1024 8 a100_40gb 53.63 53.63 167 24 4 768 261 267376 33422 786432 bf16 PURE FULL_SHARD False False 758897664
A100_40GB 760m 512 8 a100_40gb 53.47 53.47 166 48 4 1536 545 279504 34938 786432 bf16 PURE FULL_SHARD False False 758111232
A100_40GB 350m 32768 8 a100_40gb 51.55 51.55 160 1 4 32 3 107329 13416 1048576 bf16 PURE FULL_SHARD False False 387442688
A100_40GB 350m 16384 8 a100_40gb 51.78 51.78 161 2 4 64 11 183175 22896 1048576 bf16 PURE FULL_SHARD False False 370665472
A100_40GB 350m 8192 8 a100_40gb 51.39 51.39 160 4 4 128 34 279466 34933 1048576 bf16 PURE FULL_SHARD False False 362276864
A100_40GB 350m 4096 8 a100_40gb 50.38 50.38 157 8 4 256 91 374670 46833 1048576 bf16 PURE FULL_SHARD False False 358082560
A100_40GB 350m 2048 128 a100_40gb 45.61 45.61 142 18 1 2304 3245 6647647 51934 4718592 bf16 PURE FULL_SHARD False False 355985408
A100_40GB 350m 2048 64 a100_40gb 46.27 46.27 144 18 1 1152 1646 3372118 52689 2359296 bf16 PURE FULL_SHARD False False 355985408
A100_40GB 350m 2048 32 a100_40gb 47.26 47.26 147 18 1 576 840 1721978 53811 1179648 bf16 PURE FULL_SHARD False False 355985408
A100_40GB 350m 2048 16 a100_40gb 48.66 48.66 151 18 1 288 432 886622 55413 589824 bf16 PURE FULL_SHARD False False 355985408
A100_40GB 350m 2048 8 a100_40gb 49.17 49.17 153 16 4 512 218 447963 55995 1048576 bf16 PURE FULL_SHARD False False 355985408
A100_40GB 350m 1024 8 a100_40gb 48.73 48.73 152 32 4 1024 488 500184 62523 1048576 bf16 PURE FULL_SHARD False False 354936832
A100_40GB 350m 512 8 a100_40gb 48.39 48.39 150 64 4 2048 1035 530277 66284 1048576 bf16 PURE FULL_SHARD False False 354412544
A100_40GB 125m 32768 8 a100_40gb 47.27 47.27 147 1 4 32 7 261208 32651 1048576 bf16 PURE FULL_SHARD False False 148904448
A100_40GB 125m 16384 8 a100_40gb 46.77 46.77 145 2 3 48 27 443876 55484 786432 bf16 PURE FULL_SHARD False False 136321536
A100_40GB 125m 8192 8 a100_40gb 46.94 46.94 146 5 3 120 84 694868 86858 983040 bf16 PURE FULL_SHARD False False 130030080
A100_40GB 125m 4096 8 a100_40gb 44.82 44.82 139 13 3 312 224 921297 115162 1277952 bf16 PURE FULL_SHARD False False 126884352
A100_40GB 125m 2048 128 a100_40gb 38.86 38.86 121 26 1 3328 7746 15863837 123936 6815744 bf16 PURE FULL_SHARD False False 125311488
A100_40GB 125m 2048 64 a100_40gb 39.27 39.27 122 26 1 1664 3913 8015010 125234 3407872 bf16 PURE FULL_SHARD False False 125311488
A100_40GB 125m 2048 32 a100_40gb 39.86 39.86 124 26 1 832 1986 4067922 127122 1703936 bf16 PURE FULL_SHARD False False 125311488
A100_40GB 125m 2048 16 a100_40gb 40.93 40.93 127 26 1 416 1019 2088560 130535 851968 bf16 PURE FULL_SHARD False False 125311488
A100_40GB 125m 2048 8 a100_40gb 42.75 42.75 133 26 3 624 532 1090678 136334 1277952 bf16 PURE FULL_SHARD False False 125311488
A100_40GB 125m 1024 8 a100_40gb 40.89 40.89 127 52 3 1248 1158 1186314 148289 1277952 bf16 PURE FULL_SHARD False False 124525056
A100_40GB 125m 512 8 a100_40gb 40.26 40.26 125 104 3 2496 2448 1253886 156735 1277952 bf16 PURE FULL_SHARD False False 124131840
"""

MODEL = """
// The benchmark's MPT: learned positions (its parameter count holds seq x d of them), pre-
// LayerNorm blocks with biases, GeLU MLP of 4d, flash attention, the head tied to the
// embedding, vocabulary 50,368. tally counts the published parameters exactly.
block MLP(d) {
  fc   = Linear(d, 4 * d)
  proj = Linear(4 * d, d)
  forward(x) { return proj(gelu(fc(x))) }
}

block SelfAttention(d, heads) {
  qkv  = Linear(d, 3 * d)
  proj = Linear(d, d)
  forward(x) {
    q, k, v = split(qkv(x), 3, dim = -1)
    return proj(attention(q, k, v, heads = heads, causal = true))
  }
}

block Block(d, heads) {
  ln1  = LayerNorm(d)
  attn = SelfAttention(d, heads)
  ln2  = LayerNorm(d)
  mlp  = MLP(d)
  forward(x) {
    x = x + attn(ln1(x))
    return x + mlp(ln2(x))
  }
}

model MPT(vocab = 50368, ctx, d, heads, layers) {
  wte = Embedding(vocab, d)
  wpe = Embedding(ctx, d)
  h   = repeat(layers) Block(d, heads)
  lnf = LayerNorm(d)
  forward(tokens: i32[batch, seq]) {
    x = h(wte(tokens) + wpe(positions(seq)))
    logits = lnf(x) @ transpose(wte.weight)
    return cross_entropy(logits, next_tokens(tokens))
  }
}
"""


def plan_text(target, size, seq, gpus, micro, accum, batch, tps, tokens, prec, mode, ckpt,
              mfu, params):
    d, heads, layers = DIMS[size]
    step = tokens / tps
    share = 4.0 * layers * d * seq / (2.0 * params + 4.0 * layers * d * seq)
    bound = "0.30"
    why = ("// Attention is %.0f%% of the model FLOPs here; it ran as MPT's Triton kernel\n"
           "// (attention_kernel = flash1_triton below).\n" % (100 * share))
    mixed = ("amp_bf16 with FSDP mixed precision DEFAULT: bf16 compute, fp32 gradient reduction"
             if prec == "amp_bf16" else
             "bf16 with FSDP mixed precision PURE: bf16 compute and gradient reduction")
    precision = ("{ params = bf16, grads = fp32, activations = bf16, master = fp32, "
                 "optimizer = fp32 }" if prec == "amp_bf16" else "mixed_bf16")
    head = (
        "// MosaicML llm-foundry, scripts/train/benchmarking/README.md (\"MPT Training Benchmarks\"),\n"
        "// table \"%s\": MPT-%s at sequence %d on %d GPUs, micro-batch %d, %d\n"
        "// accumulation steps, global batch %d sequences (%d tokens), PyTorch FSDP\n"
        "// FULL_SHARD (ZeRO-3 over all GPUs, across nodes above 8), %s,\n"
        "// %s. Published: %d tokens/s, MFU %s%%, %d parameters.\n"
        "// Measured step: %d tokens / %d tokens/s = %.4f s.\n"
        "// Written by gen_a100_rows.py from the table's row.\n%s"
        "// validation: source = llm-foundry benchmarks, \"%s\"\n"
        "// validation: measured_step_s = %.4f\n"
        "// validation: measured = %d tokens/s\n"
        "// validation: bound = %s\n") % (
            TABLES[target], size, seq, gpus, micro, accum, batch, tokens, mixed,
            "activation checkpointing on every block" if ckpt else "no activation checkpointing",
            tps, mfu, params, tokens, tps, step, why, TABLES[target], step, tps, bound)
    plan = """
train mpt {
  model       = MPT(ctx = %d, d = %d, heads = %d, layers = %d)
  batch       = %d
  seq         = %d
  micro_batch = %d
  optimizer   = AdamW(lr = 1e-4)
  precision   = %s
  checkpoint  = %s
  target      = %d x %s { zero = 3, attention_kernel = flash1_triton }
}
""" % (seq, d, heads, layers, batch, seq, micro, precision, "full" if ckpt else "none", gpus,
       target)
    return head + MODEL + plan


def main():
    tally, out = sys.argv[1], sys.argv[2]
    written = skipped = 0
    for line in ROWS.strip().split("\n"):
        f = line.split()
        target, size, seq, gpus = f[0], f[1], int(f[2]), int(f[3])
        mfu, micro, accum, batch = f[5], int(f[8]), int(f[9]), int(f[10])
        tps, tokens, prec, mode = int(f[12]), int(f[14]), f[15], f[16]
        ckpt, params = f[18] == "True", int(f[20])
        name = "mpt-%s-s%d-%dx%s.tally" % (size, seq, gpus, target)
        path = os.path.join(out, name)
        if size not in DIMS or os.path.exists(path) or batch * seq != tokens:
            skipped += 1
            continue
        if micro * accum * gpus < batch:
            # llm-foundry's micro-batching: a last, smaller micro-batch (README); tally's plan
            # needs micro x accumulation x data = batch.
            skipped += 1
            continue
        text = plan_text(target, size, seq, gpus, micro, accum, batch, tps, tokens, prec, mode,
                         ckpt, mfu, params)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        r = subprocess.run([tally, "report", tmp, "--format", "json"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, universal_newlines=True)
        try:
            counted = int(json.loads(r.stdout)["params"]["total"])
        except (ValueError, KeyError, TypeError):
            counted = -1
        if r.returncode != 0 and counted == params:
            # tally says the run cannot run (its memory estimate exceeds the device) although it
            # did: a finding about the memory model, listed by docs/validation.md, not a row
            # whose time can be compared.
            print("skip %s: tally reports an error for a run that ran" % name)
            os.remove(tmp)
            skipped += 1
            continue
        if counted != params:
            print("skip %s: tally counts %d parameters, the table %d" % (name, counted, params))
            os.remove(tmp)
            skipped += 1
            continue
        os.replace(tmp, path)
        written += 1
    print("gen_a100_rows: %d written, %d skipped" % (written, skipped))


if __name__ == "__main__":
    main()
