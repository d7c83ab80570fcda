#!/usr/bin/env python3
"""check_html.py — tests `tally report --format html`: the page's structure, then its pixels.

Usage: check_html.py TALLY FILE.tally WORKDIR [--budget] [--pipeline]

1. Runs `TALLY report FILE --format html -o WORKDIR/report.html` (exit 0, or 1 for a broken
   budget, are both fine: the page is written either way).
2. Parses the page with html.parser and requires: no <script>, no external reference (src=,
   href=, url(, @import); the four charts as <svg> elements with ids roofline, memory, blocks,
   checkpoint, each with its data marks — the roofline two ceilings, a ridge and op points
   whose hover <title> names the op path and its source line; the memory bar's segments and
   the capacity line (and the budget line with --budget); one bar per block; the checkpoint
   curve and its chosen point; with --pipeline a fifth chart, the pipeline schedule, whose
   slots each carry a hover title — and the report's tables.
3. When Debian's chromium is installed, renders (a) the whole page and (b) a page holding only
   the four charts stacked at known offsets, each to PNG with `chromium --headless
   --no-sandbox --disable-gpu --screenshot`, and fails when a chart's region has too few pixels
   of its data colours beyond its legend swatches (an empty or missing chart) or the page is
   blank; then (c) loads the page with a script that measures every chart's <text> as laid
   out (getBBox, `--dump-dom` prints the result) and fails on text that leaves its chart or
   overlaps another label. Without chromium it
   prints "SKIP: chromium not found" and checks the structure only.
Prints "html ok: ..." and exits 0, or prints the problems and exits 1.
"""
import html.parser
import html
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

CHARTS = ["roofline", "memory", "blocks", "checkpoint"]
problems = []


def need(cond, what):
    if not cond:
        problems.append(what)
    return cond


class Page(html.parser.HTMLParser):
    """Collects every element with its attributes, the SVGs by id, and <title> texts."""

    def __init__(self):
        super().__init__()
        self.stack = []          # open elements: (tag, attrs)
        self.svgs = {}           # id -> {"attrs", "elements": [(tag, attrs)], "titles": [(parent, attrs, text)]}
        self.current_svg = None
        self.tags = []
        self.title_parent = None
        self.text = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        if tag == "svg":
            self.current_svg = attrs.get("id", "")
            self.svgs[self.current_svg] = {"attrs": attrs, "elements": [], "titles": []}
        elif self.current_svg is not None:
            self.svgs[self.current_svg]["elements"].append((tag, attrs))
            if tag == "title":
                self.title_parent = self.stack[-1] if self.stack else None
                self.text = ""
        self.stack.append((tag, attrs))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        self.handle_endtag(tag)

    def handle_data(self, data):
        self.text += data

    def handle_endtag(self, tag):
        if tag == "title" and self.current_svg is not None and self.title_parent is not None:
            parent_tag, parent_attrs = self.title_parent
            self.svgs[self.current_svg]["titles"].append((parent_tag, parent_attrs, self.text))
            self.title_parent = None
        if tag == "svg":
            self.current_svg = None
        while self.stack:
            t, _ = self.stack.pop()
            if t == tag:
                break


def marks(svg, tag, cls):
    return [a for t, a in svg["elements"] if t == tag and cls in a.get("class", "").split()]


def check_structure(text, budget):
    need("<script" not in text.lower(), "the page has a <script>")
    for ref in ("src=", "href=", "url(", "@import"):
        need(ref not in text, "the page refers to something outside it (%s)" % ref)
    page = Page()
    page.feed(text)
    for chart in CHARTS:
        need(chart in page.svgs, "chart '%s' is missing" % chart)
    if problems:
        return page
    roof = page.svgs["roofline"]
    need(len(marks(roof, "line", "memory-ceiling")) == 1, "roofline: no memory ceiling")
    need(len(marks(roof, "line", "compute-ceiling")) == 1, "roofline: no compute ceiling")
    need(len(marks(roof, "line", "ridge")) == 1, "roofline: no ridge")
    ops = marks(roof, "circle", "op")
    need(len(ops) >= 3, "roofline: %d op points" % len(ops))
    op_titles = [text for tag, attrs, text in roof["titles"] if tag == "circle"]
    need(len(op_titles) == len(ops), "roofline: an op point has no hover title")
    need(all(re.search(r"\.tally line [0-9]+\)", t) and "FLOP/byte" in t for t in op_titles),
         "roofline: a hover title lacks the source line or intensity")
    mem = page.svgs["memory"]
    need(len(marks(mem, "rect", "segment")) >= 3, "memory: fewer than 3 segments")
    need(len(marks(mem, "line", "capacity")) == 1, "memory: no capacity line")
    if budget:
        need(len(marks(mem, "line", "budget")) == 1, "memory: no budget line")
    need(len(marks(page.svgs["blocks"], "rect", "bar")) >= 3, "blocks: fewer than 3 bars")
    ck = page.svgs["checkpoint"]
    need(len(marks(ck, "polyline", "curve")) == 1, "checkpoint: no curve")
    need(len(marks(ck, "circle", "chosen")) == 1, "checkpoint: no chosen point")
    if "pipeline" in CHARTS:
        pl = page.svgs["pipeline"]
        slots = marks(pl, "rect", "slot")
        need(len(slots) >= 4, "pipeline: %d slots" % len(slots))
        slot_titles = [text for tag, attrs, text in pl["titles"] if tag == "rect"]
        need(len(slot_titles) == len(slots) and
             all(re.match(r"stage [0-9]+: (forward|backward) of micro-batch [0-9]+", t) for t in slot_titles),
             "pipeline: a slot lacks its hover title")
    tables = [a for t, a in page.tags if t == "table"]
    need(len(tables) >= 5, "only %d tables" % len(tables))
    return page


def read_png(path):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise ValueError("unsupported PNG (depth %d, colour type %d)" % (depth, ctype))
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev, i = [], bytearray(stride), 0
    for _ in range(height):
        ftype, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if ftype == 1:
                line[x] = (line[x] + a) & 255
            elif ftype == 2:
                line[x] = (line[x] + b) & 255
            elif ftype == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif ftype == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[x] = (line[x] + pred) & 255
        rows.append([tuple(line[x:x + 3]) for x in range(0, stride, bpp)])
        prev = line
    return width, height, rows


def hex_rgb(color):
    color = color.lstrip("#")
    return tuple(int(color[i:i + 2], 16) for i in (0, 2, 4))


def over_white(px, c, tol):
    """Whether pixel px is colour c drawn over white at an opacity of 0.6 or more (the charts'
    marks are translucent: a roofline point is c at 0.8), each channel within tol."""
    for alpha in (1.0, 0.9, 0.8, 0.7, 0.6):
        if all(abs(px[i] - (255 - alpha * (255 - c[i]))) <= tol for i in range(3)):
            return True
    return False


def count_colour(rows, x0, y0, x1, y1, colours, tol=12):
    n = 0
    for y in range(max(y0, 0), min(y1, len(rows))):
        row = rows[y]
        for x in range(max(x0, 0), min(x1, len(row))):
            px = row[x]
            if px == (255, 255, 255):
                continue
            for c in colours:
                if over_white(px, c, tol):
                    n += 1
                    break
    return n


def screenshot(chromium, html_path, png_path, width, height):
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--window-size=%d,%d" % (width, height), "--screenshot=" + png_path, "file://" + html_path]
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    return need(os.path.exists(png_path), "chromium wrote no screenshot for " + html_path)


def check_pixels(chromium, page, text, workdir):
    # (a) The whole page: something drawn in every chart's colours.
    full = os.path.join(workdir, "page.png")
    if screenshot(chromium, os.path.join(workdir, "report.html"), full, 900, 2400):
        w, h, rows = read_png(full)
        white = (255, 255, 255)
        drawn = sum(1 for row in rows for px in row if px != white)
        need(drawn > w * h // 50, "the page renders nearly blank (%d non-white pixels)" % drawn)
    # (b) The charts alone, stacked at known offsets: each region needs its data colours.
    start = 0
    boxes = []
    chunks = []
    for chart in CHARTS:
        attrs = page.svgs[chart]["attrs"]
        width, height = int(float(attrs["width"])), int(float(attrs["height"]))
        begin = text.index('<svg xmlns="http://www.w3.org/2000/svg" id="%s"' % chart)
        end = text.index("</svg>", begin) + len("</svg>")
        chunks.append('<div style="position:absolute; left:0; top:%dpx">%s</div>' % (start, text[begin:end]))
        series = attrs.get("data-series-colors", "").split()
        colours = [hex_rgb(c) for c in series]
        # Legend swatches (10 x 10 px) share the data colours: their pixels do not count.
        swatches = len([a for a in marks(page.svgs[chart], "rect", "legend") if a.get("fill") in series])
        boxes.append((chart, start, width, height, colours, swatches * 100))
        start += height
    charts_html = os.path.join(workdir, "charts.html")
    with open(charts_html, "w") as f:
        f.write('<!DOCTYPE html><html><head><meta charset="utf-8"><style>body { margin: 0; }'
                '</style></head><body>%s</body></html>' % "".join(chunks))
    png = os.path.join(workdir, "charts.png")
    if not screenshot(chromium, charts_html, png, 800, start):
        return
    _, _, rows = read_png(png)
    for chart, top, width, height, colours, legend in boxes:
        need(colours, chart + ": no data-series-colors")
        n = count_colour(rows, 0, top, width, top + height, colours) - legend
        need(n >= 60, "%s: %d pixels of its data colours in its region (empty chart)" % (chart, n))
        print("%s: %d data pixels" % (chart, n))


# Run in the page by chromium --dump-dom: every <text> of every chart measured as rendered
# (getBBox, in the chart's own coordinates); one line per text that leaves its chart, and per
# pair of texts in a chart whose boxes overlap by more than 2 px each way.
LAYOUT_SCRIPT = r"""
<script>
(function () {
  var out = [];
  document.querySelectorAll('svg').forEach(function (svg) {
    var vb = svg.viewBox.baseVal, boxes = [];
    svg.querySelectorAll('text').forEach(function (t) {
      var b = t.getBBox(), label = t.textContent;
      var m = t.getCTM(), p0 = svg.createSVGPoint(), p1 = svg.createSVGPoint();
      p0.x = b.x; p0.y = b.y; p1.x = b.x + b.width; p1.y = b.y + b.height;
      var inv = svg.getScreenCTM().inverse(), s = t.getScreenCTM();
      var a = p0.matrixTransform(s).matrixTransform(inv), c = p1.matrixTransform(s).matrixTransform(inv);
      var box = {x0: Math.min(a.x, c.x), y0: Math.min(a.y, c.y), x1: Math.max(a.x, c.x),
                 y1: Math.max(a.y, c.y), label: label};
      if (box.x0 < -0.5 || box.y0 < -0.5 || box.x1 > vb.width + 0.5 || box.y1 > vb.height + 0.5)
        out.push('CLIPPED ' + svg.id + ': "' + label + '" spans x ' + box.x0.toFixed(1) + '-' +
                 box.x1.toFixed(1) + ', y ' + box.y0.toFixed(1) + '-' + box.y1.toFixed(1) +
                 ' of ' + vb.width + ' x ' + vb.height);
      boxes.forEach(function (o) {
        var dx = Math.min(box.x1, o.x1) - Math.max(box.x0, o.x0);
        var dy = Math.min(box.y1, o.y1) - Math.max(box.y0, o.y0);
        if (dx > 2 && dy > 2)
          out.push('OVERLAP ' + svg.id + ': "' + o.label + '" and "' + label + '"');
      });
      boxes.push(box);
    });
  });
  var pre = document.createElement('pre');
  pre.id = 'layout-check';
  pre.textContent = 'LAYOUT-BEGIN\n' + out.join('\n') + '\nLAYOUT-END';
  document.body.appendChild(pre);
})();
</script>
"""


def check_layout(chromium, text, workdir):
    """Every chart's text inside its chart and no two labels on top of each other, as chromium
    lays them out (the legend once ran off the memory chart: "frame…")."""
    page = os.path.join(workdir, "layout.html")
    with open(page, "w", encoding="utf-8") as f:
        f.write(text.replace("</body>", LAYOUT_SCRIPT + "</body>"))
    r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                        "file://" + page], capture_output=True, text=True, timeout=120)
    dom = r.stdout
    found = re.search(r'<pre id="layout-check">LAYOUT-BEGIN(.*?)LAYOUT-END</pre>', dom, re.S)
    if not need(found, "chromium ran no layout script (--dump-dom printed %d bytes)" % len(dom)):
        return
    body = found.group(1)
    lines = [html.unescape(l) for l in body.strip().splitlines() if l.strip()]
    for line in lines:
        need(False, line)
    if not lines:
        print("layout ok: no text clipped or overlapping")


def main():
    args = sys.argv[1:]
    budget = "--budget" in args
    if "--pipeline" in args:  # the plan has pipeline stages: a fifth chart, the schedule
        CHARTS.append("pipeline")
    args = [a for a in args if a not in ("--budget", "--pipeline")]
    tally, source, workdir = args
    os.makedirs(workdir, exist_ok=True)
    out = os.path.join(workdir, "report.html")
    if os.path.exists(out):
        os.remove(out)
    rc = subprocess.run([tally, "report", source, "--format", "html", "-o", out],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
    need(rc in (0, 1), "tally report exited %d" % rc)
    if not need(os.path.exists(out), "no page written"):
        return finish()
    with open(out, encoding="utf-8") as f:
        text = f.read()
    page = check_structure(text, budget)
    if problems:
        return finish()
    chromium = shutil.which("chromium")
    if chromium is None:
        print("SKIP: chromium not found; checked the structure only")
    else:
        check_pixels(chromium, page, text, workdir)
        check_layout(chromium, text, workdir)
    if not problems:
        print("html ok: %d op points, %d tables" % (len(marks(page.svgs["roofline"], "circle", "op")),
                                                    len([t for t, _ in page.tags if t == "table"])))
    return finish()


def finish():
    for p in problems:
        print("html check failed: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
