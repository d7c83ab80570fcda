// The tally language: blocks and models with parameters and a forward function, and the
// train / infer / target declarations that say how a model is run and on what.
// The parser is generated from this file at build time (see CMakeLists.txt); frontend/Parser.cpp
// turns the parse tree into our own AST, so nothing outside frontend/ sees ANTLR types.
grammar Tally;

@parser::members {
  /// A unit word binds to the number before it only on the same line, so that
  /// `batch = 512` followed by `seq = 1024` on the next line is two settings, and
  /// `8 x H100_SXM` is a device count, not 8 of a unit called x.
  bool unitAhead() {
    antlr4::Token *prev = _input->LT(-1);
    antlr4::Token *next = _input->LT(1);
    return prev && next && prev->getLine() == next->getLine() && next->getText() != "x";
  }
  bool timesAhead() { return _input->LT(2)->getText() == "x"; }
  /// `3.35TB/s`: a number with a glued unit, then `/s` written without spaces, is one rate;
  /// `10B / s` or `10B/seq` stay divisions.
  bool gluedRateAhead() {
    antlr4::Token *num = _input->LT(-1), *slash = _input->LT(1), *s = _input->LT(2);
    if (!num || slash->getText() != "/" || s->getText() != "s")
      return false;
    std::string t = num->getText();
    char last = t.empty() ? '0' : t.back();
    bool letter = (last >= 'a' && last <= 'z') || (last >= 'A' && last <= 'Z');
    return letter && slash->getStartIndex() == num->getStopIndex() + 1 &&
           s->getStartIndex() == slash->getStopIndex() + 1;
  }
  /// `8x H100_SXM`: a whole number with the `x` glued to it, then the device name.
  bool gluedTimesAhead() {
    std::string t = _input->LT(1)->getText();
    if (t.size() < 2 || t.back() != 'x' || _input->LT(2)->getType() != ID)
      return false;
    for (size_t i = 0; i + 1 < t.size(); ++i)
      if (t[i] < '0' || t[i] > '9')
        return false;
    return true;
  }
}

file : decl* EOF ;

decl : blockDecl | planDecl | targetDecl ;

// ---- blocks and models --------------------------------------------------------------------
blockDecl : kw=(BLOCK | MODEL) name=ID '(' (blockParam (',' blockParam)*)? ','? ')' '{' blockItem* '}' ;
blockParam : name=ID ('=' expr)? ;

blockItem
  : FROZEN? PARAM name=ID ':' tensorType                        # paramDecl
  | FROZEN? name=ID '=' expr                                    # memberDecl
  | FORWARD '(' (fwdParam (',' fwdParam)*)? ')' body            # forwardDecl
  | IF expr '{' blockItem* '}' (ELSE '{' elseItems+=blockItem* '}')?  # blockIf
  ;

fwdParam : name=ID (':' tensorType)? ;
tensorType : dtype=ID? '[' (expr (',' expr)*)? ']' ;

body : '{' stmt* '}' ;
stmt
  : ID (',' ID)* '=' expr                                       # assignStmt
  | RETURN expr                                                 # returnStmt
  | IF expr body (ELSE elseBody=body)?                          # ifStmt
  ;

// ---- plans and targets ----------------------------------------------------------------
planDecl : kw=(TRAIN | INFER) name=ID '{' planItem* '}' ;
planItem
  : key=settingKey '=' expr                                     # setting
  | BUDGET '{' budgetItem* '}'                                  # budgetBlock
  ;
settingKey : ID | MODEL | TARGET | PARAM ;
budgetItem : ID+ op=('<=' | '>=' | '<' | '>') expr ;

targetDecl : TARGET name=ID '{' targetItem* '}' ;
targetItem
  : key=ID '=' expr                                             # targetSetting
  | key=ID record                                               # targetRecord
  ;

// ---- expressions ------------------------------------------------------------------------
expr
  : expr '(' (arg (',' arg)*)? ','? ')'                         # callExpr
  | expr '.' ID                                                 # memberExpr
  | expr '[' subscript (',' subscript)* ']'                    # indexExpr
  | '-' expr                                                    # negExpr
  | expr op=('*' | '/' | '@') expr                              # mulExpr
  | expr op=('+' | '-') expr                                    # addExpr
  | REPEAT '(' expr ')' expr                                    # repeatExpr
  | {timesAhead()}? NUMBER ID device=ID record?                 # deviceExpr
  | {gluedTimesAhead()}? NUMBER device=ID record?               # deviceExpr
  | NUMBER ({unitAhead()}? unit | {gluedRateAhead()}? gluedRate)?  # numberExpr
  | ID                                                          # nameExpr
  | STRING                                                      # stringExpr
  | '(' expr ')'                                                # parenExpr
  | '(' expr ',' (expr (',' expr)*)? ')'                        # tupleExpr
  | '[' (expr (',' expr)*)? ']'                                 # listExpr
  | record                                                      # recordExpr
  ;

arg : (name=ID '=')? expr ;
// `x[0]`, `x[:, 1:]`, `x[lo:hi:step]`: an index, or a slice whose bounds may be left out.
subscript
  : lo=expr? ':' hi=expr? (':' step=expr?)?                     # sliceSub
  | expr                                                        # indexSub
  ;
unit : ID ('/' ID)? ;
gluedRate : '/' ID ;
record : '{' (field ','?)* '}' ;
field : key=ID '=' expr (ON where=ID)? ;

// ---- tokens -----------------------------------------------------------------------------
BLOCK : 'block' ;
MODEL : 'model' ;
PARAM : 'param' ;
FORWARD : 'forward' ;
RETURN : 'return' ;
REPEAT : 'repeat' ;
TRAIN : 'train' ;
INFER : 'infer' ;
TARGET : 'target' ;
BUDGET : 'budget' ;
FROZEN : 'frozen' ;
IF : 'if' ;
ELSE : 'else' ;
ON : 'on' ;

// A number may carry a glued suffix: a count (10B, 2T, 512K), a percentage (40%) or a unit (80GiB).
// A glued rate (3.35TB/s) is NUMBER '/' 's' with nothing between; see gluedRateAhead().
NUMBER : DIGITS ('.' DIGITS?)? ([eE] [+-]? DIGITS)? [a-zA-Z_%]* ;
fragment DIGITS : [0-9] ('_'? [0-9])* ;
ID : [a-zA-Z_] [a-zA-Z_0-9]* ;
STRING : '"' (~["\\\r\n] | '\\' .)* '"' ;

LINE_COMMENT : '//' ~[\r\n]* -> skip ;
HASH_COMMENT : '#' ~[\r\n]* -> skip ;
BLOCK_COMMENT : '/*' .*? '*/' -> skip ;
WS : [ \t\r\n]+ -> skip ;
// Anything else is one bad character; the parser reports it with its location.
ERROR_CHAR : . ;
