/*
 * lcmac_json.c — a small strict JSON reader (RFC 8259) for artifact manifests; #included by
 * lcmac_c.c, so everything here is static.
 *
 * lj_parse turns a whole document into a flat array of nodes in document order (an object's
 * node is followed by its members, each a key node then the value's nodes).  It reads only
 * src[0, n) (no terminating NUL needed) and malformed input is an error naming the byte
 * offset and the reason.  Strict on purpose: no comments, trailing commas, NaN/Infinity,
 * leading zeros, control characters, lone surrogates or invalid UTF-8, and nesting at most
 * LJ_MAX_DEPTH deep (the parser recurses).  A key that occurs twice in an object is refused
 * where it is looked up (lj_get): Python's json keeps the last one, and the two readers must
 * never see different values.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LJ_MAX_DEPTH 64

typedef enum { LJ_NULL, LJ_BOOL, LJ_NUMBER, LJ_STRING, LJ_ARRAY, LJ_OBJECT } lj_type;

typedef struct {
  lj_type type;
  size_t start, len;   /* the token's bytes in src; a string's without its quotes */
  int next;            /* index of the first node after this one's subtree */
  int count;           /* array: elements; object: members */
} lj_node;

typedef struct {
  const char* src;
  size_t n, pos;
  lj_node* nodes;
  int count, cap;
  char err[160];
} lj_doc;

static int lj_fail(lj_doc* d, const char* why) {
  snprintf(d->err, sizeof d->err, "malformed JSON at byte %zu: %s", d->pos, why);
  return -1;
}

static void lj_ws(lj_doc* d) {
  while (d->pos < d->n) {
    char c = d->src[d->pos];
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
    d->pos++;
  }
}

static int lj_new(lj_doc* d, lj_type t, size_t start) {
  if (d->count == d->cap) {
    if (d->cap > (1 << 24)) return lj_fail(d, "too many values");
    int cap = d->cap ? 2 * d->cap : 64;
    lj_node* p = (lj_node*)realloc(d->nodes, (size_t)cap * sizeof *p);
    if (!p) return lj_fail(d, "out of memory");
    d->nodes = p;
    d->cap = cap;
  }
  lj_node* x = &d->nodes[d->count];
  x->type = t;
  x->start = start;
  x->len = 0;
  x->count = 0;
  x->next = d->count + 1;
  return d->count++;
}

static int lj_hex4(const char* s, uint32_t* v) {
  *v = 0;
  for (int i = 0; i < 4; ++i) {
    char c = s[i];
    int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (x < 0) return -1;
    *v = *v << 4 | (uint32_t)x;
  }
  return 0;
}

/* Length of the well-formed UTF-8 sequence at s (at most avail bytes), 0 if there is none:
 * overlong forms, surrogates and code points above U+10FFFF are not well-formed. */
static size_t lj_utf8(const unsigned char* s, size_t avail) {
  unsigned c = s[0];
  size_t len;
  uint32_t cp, min;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
  else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
  else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
  else return 0;
  if (len > avail) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (s[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

/* A string token at d->pos (its opening quote); validates escapes and UTF-8. */
static int lj_string_tok(lj_doc* d) {
  int self = lj_new(d, LJ_STRING, d->pos + 1);
  if (self < 0) return -1;
  size_t i = d->pos + 1;
  for (;;) {
    if (i >= d->n) return lj_fail(d, "unterminated string");
    unsigned char c = (unsigned char)d->src[i];
    if (c == '"') break;
    if (c < 0x20) { d->pos = i; return lj_fail(d, "control character in a string"); }
    if (c == '\\') {
      if (i + 1 >= d->n) return lj_fail(d, "unterminated string");
      char e = d->src[i + 1];
      if (e != 'u') {
        if (!strchr("\"\\/bfnrt", e) || !e) { d->pos = i; return lj_fail(d, "unknown escape"); }
        i += 2;
        continue;
      }
      uint32_t u, lo;
      d->pos = i;
      if (i + 6 > d->n || lj_hex4(d->src + i + 2, &u)) return lj_fail(d, "bad \\u escape");
      i += 6;
      if (u >= 0xDC00 && u <= 0xDFFF) return lj_fail(d, "lone low surrogate");
      if (u >= 0xD800 && u <= 0xDBFF) {   /* must be followed by its low half */
        if (i + 6 > d->n || d->src[i] != '\\' || d->src[i + 1] != 'u' ||
            lj_hex4(d->src + i + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
          return lj_fail(d, "lone high surrogate");
        i += 6;
      }
      continue;
    }
    size_t k = lj_utf8((const unsigned char*)d->src + i, d->n - i);
    if (!k) { d->pos = i; return lj_fail(d, "invalid UTF-8 in a string"); }
    i += k;
  }
  d->nodes[self].len = i - d->nodes[self].start;
  d->pos = i + 1;
  return self;
}

static int lj_digits(lj_doc* d) {   /* one or more digits */
  size_t p = d->pos;
  while (d->pos < d->n && d->src[d->pos] >= '0' && d->src[d->pos] <= '9') d->pos++;
  return d->pos > p ? 0 : lj_fail(d, "expected a digit");
}

static int lj_number_tok(lj_doc* d) {
  int self = lj_new(d, LJ_NUMBER, d->pos);
  if (self < 0) return -1;
  if (d->src[d->pos] == '-') d->pos++;
  if (d->pos < d->n && d->src[d->pos] == '0') {
    d->pos++;
    if (d->pos < d->n && d->src[d->pos] >= '0' && d->src[d->pos] <= '9')
      return lj_fail(d, "leading zero in a number");
  } else if (lj_digits(d)) {
    return -1;
  }
  if (d->pos < d->n && d->src[d->pos] == '.') {
    d->pos++;
    if (lj_digits(d)) return -1;
  }
  if (d->pos < d->n && (d->src[d->pos] == 'e' || d->src[d->pos] == 'E')) {
    d->pos++;
    if (d->pos < d->n && (d->src[d->pos] == '+' || d->src[d->pos] == '-')) d->pos++;
    if (lj_digits(d)) return -1;
  }
  d->nodes[self].len = d->pos - d->nodes[self].start;
  return self;
}

static int lj_literal(lj_doc* d, const char* word, lj_type t) {
  size_t k = strlen(word);
  if (d->n - d->pos < k || memcmp(d->src + d->pos, word, k)) return lj_fail(d, "unexpected character");
  int self = lj_new(d, t, d->pos);
  if (self < 0) return -1;
  d->nodes[self].len = k;
  d->pos += k;
  return self;
}

static int lj_value(lj_doc* d, int depth);

/* An array or object at d->pos.  Nodes may move (realloc): indices only, no pointers. */
static int lj_container(lj_doc* d, int depth) {
  char open = d->src[d->pos], close = open == '{' ? '}' : ']';
  if (depth >= LJ_MAX_DEPTH) return lj_fail(d, "nested too deeply");
  int self = lj_new(d, open == '{' ? LJ_OBJECT : LJ_ARRAY, d->pos);
  if (self < 0) return -1;
  d->pos++;
  lj_ws(d);
  if (d->pos < d->n && d->src[d->pos] == close) {
    d->pos++;
  } else {
    for (;;) {
      if (open == '{') {
        lj_ws(d);
        if (d->pos >= d->n || d->src[d->pos] != '"') return lj_fail(d, "expected a string key");
        if (lj_string_tok(d) < 0) return -1;
        lj_ws(d);
        if (d->pos >= d->n || d->src[d->pos] != ':') return lj_fail(d, "expected ':'");
        d->pos++;
      }
      if (lj_value(d, depth + 1) < 0) return -1;
      d->nodes[self].count++;
      lj_ws(d);
      if (d->pos >= d->n) return lj_fail(d, open == '{' ? "unterminated object" : "unterminated array");
      if (d->src[d->pos] == ',') { d->pos++; continue; }
      if (d->src[d->pos] == close) { d->pos++; break; }
      return lj_fail(d, open == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  }
  d->nodes[self].len = d->pos - d->nodes[self].start;
  d->nodes[self].next = d->count;
  return self;
}

static int lj_value(lj_doc* d, int depth) {
  lj_ws(d);
  if (d->pos >= d->n) return lj_fail(d, "unexpected end of input");
  char c = d->src[d->pos];
  switch (c) {
    case '{': case '[': return lj_container(d, depth);
    case '"': return lj_string_tok(d);
    case 't': return lj_literal(d, "true", LJ_BOOL);
    case 'f': return lj_literal(d, "false", LJ_BOOL);
    case 'n': return lj_literal(d, "null", LJ_NULL);
    default:
      if (c == '-' || (c >= '0' && c <= '9')) return lj_number_tok(d);
      return lj_fail(d, "unexpected character");
  }
}

/* Parse src[0, n) into d (the root is node 0).  0, or -1 with d->err; lj_free either way. */
static int lj_parse(lj_doc* d, const char* src, size_t n) {
  memset(d, 0, sizeof *d);
  d->src = src;
  d->n = n;
  if (lj_value(d, 0) < 0) return -1;
  lj_ws(d);
  if (d->pos != d->n) return lj_fail(d, "trailing characters after the document");
  return 0;
}

static void lj_free(lj_doc* d) {
  free(d->nodes);
  d->nodes = NULL;
  d->count = d->cap = 0;
}

static lj_type lj_kind(const lj_doc* d, int i) {
  return i >= 0 && i < d->count ? d->nodes[i].type : LJ_NULL;
}

/* The decoded string of node i into out (NUL-terminated).  0, or -1 when i is not a string,
 * does not fit, or holds a NUL (\u0000), which a C string cannot carry.  The token was
 * validated by lj_string_tok, so its escapes are complete. */
static int lj_str(const lj_doc* d, int i, char* out, size_t cap) {
  if (lj_kind(d, i) != LJ_STRING || cap == 0) return -1;
  const char* s = d->src + d->nodes[i].start;
  size_t len = d->nodes[i].len, o = 0;
  for (size_t k = 0; k < len;) {
    uint32_t cp, lo;
    if (s[k] != '\\') {
      if (o + 1 >= cap) return -1;
      out[o++] = s[k++];
      continue;
    }
    char e = s[k + 1];
    k += 2;
    switch (e) {
      case 'b': cp = '\b'; break;
      case 'f': cp = '\f'; break;
      case 'n': cp = '\n'; break;
      case 'r': cp = '\r'; break;
      case 't': cp = '\t'; break;
      case 'u':
        lj_hex4(s + k, &cp);
        k += 4;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          lj_hex4(s + k + 2, &lo);
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          k += 6;
        }
        break;
      default: cp = (unsigned char)e;
    }
    if (cp == 0) return -1;
    char u[4];
    size_t m = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
    if (m == 1) u[0] = (char)cp;
    else {
      for (size_t j = m - 1; j > 0; --j, cp >>= 6) u[j] = (char)(0x80 | (cp & 0x3F));
      u[0] = (char)((m == 2 ? 0xC0 : m == 3 ? 0xE0 : 0xF0) | cp);
    }
    if (o + m >= cap) return -1;
    memcpy(out + o, u, m);
    o += m;
  }
  out[o] = 0;
  return 0;
}

/* The value of key in object node obj: its index, -1 when absent (or obj is no object),
 * -2 when the key occurs more than once. */
static int lj_get(const lj_doc* d, int obj, const char* key) {
  if (lj_kind(d, obj) != LJ_OBJECT) return -1;
  int found = -1, i = obj + 1;
  char k[128];
  for (int m = 0; m < d->nodes[obj].count; ++m) {
    if (lj_str(d, i, k, sizeof k) == 0 && strcmp(k, key) == 0) {
      if (found >= 0) return -2;
      found = i + 1;
    }
    i = d->nodes[i + 1].next;
  }
  return found;
}

/* Element idx of array node arr, or -1. */
static int lj_at(const lj_doc* d, int arr, int idx) {
  if (lj_kind(d, arr) != LJ_ARRAY || idx < 0 || idx >= d->nodes[arr].count) return -1;
  int i = arr + 1;
  while (idx-- > 0) i = d->nodes[i].next;
  return i;
}

/* Node i as an integer (no fraction or exponent, within int64): 0, or -1. */
static int lj_int(const lj_doc* d, int i, int64_t* v) {
  if (lj_kind(d, i) != LJ_NUMBER) return -1;
  const char* s = d->src + d->nodes[i].start;
  size_t len = d->nodes[i].len, k = 0;
  int neg = s[0] == '-';
  if (neg) k++;
  uint64_t x = 0, lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (; k < len; ++k) {
    if (s[k] < '0' || s[k] > '9') return -1;
    unsigned dgt = (unsigned)(s[k] - '0');
    if (x > (lim - dgt) / 10) return -1;
    x = x * 10 + dgt;
  }
  *v = neg ? (int64_t)(0 - x) : (int64_t)x;
  return 0;
}
