// Parsing: .tally text → AST. The ANTLR-generated parser stays behind this interface; syntax
// errors become located diagnostics, and input that could hurt the parser (invalid UTF-8,
// NUL bytes, very deep nesting) is rejected with a diagnostic before ANTLR sees it.
#pragma once

#include "frontend/AST.h"

#include <memory>

namespace tally {

class DiagnosticEngine;

/// Deepest bracket / unary nesting the parser accepts. ANTLR recursion overflows the stack at
/// about 37k levels (9k under ASan); no real configuration comes near this.
constexpr unsigned kMaxNesting = 256;
/// Most operators one statement may chain; bounds the depth of the (left-nested) parse tree.
constexpr unsigned kMaxOperatorsPerStatement = 4000;

/// Parses buffer `bufferID` of the engine's SourceMgr. Returns null when the file has syntax
/// errors (they are all reported, with recovery, before returning).
std::unique_ptr<Module> parseBuffer(unsigned bufferID, DiagnosticEngine &diags);

/// Parses buffer `bufferID` as one expression (a command-line value such as `--target '64 x
/// H100_SXM { tensor = 8 }'`, written as in a file). Returns null after reporting a syntax
/// error, or anything after the expression.
ExprPtr parseExpression(unsigned bufferID, DiagnosticEngine &diags);

} // namespace tally
