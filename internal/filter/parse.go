package filter

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// parser is a recursive-descent parser over the filter's bytes. It scans on
// demand rather than tokenizing first, because what a character means
// depends on where it is: "-" negates at the start of a term but belongs to
// the name in attributes.ce-subject. Recursion is bounded by the 256-byte
// limit Parse checks first.
type parser struct {
	s   string
	pos int
}

// parse parses s, of any length, and returns its root node (nil for an empty
// filter).
func parse(s string) (node, error) {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return nil, fmt.Errorf("%w at offset %d: the filter is not valid UTF-8", ErrInvalidFilter, i)
		}
		i += size
	}
	p := &parser{s: s}
	p.skipSpace()
	if p.eof() {
		return nil, nil
	}
	n, err := p.expression()
	if err != nil {
		return nil, err
	}
	if !p.eof() { // expression stops only at the end or before a ')'
		return nil, p.errorf(p.pos, "')' without a matching '('")
	}
	return n, nil
}

// expression parses terms joined by AND or by OR. It stops, without
// consuming it, at the end of the filter or at a ')'.
func (p *parser) expression() (node, error) {
	first, err := p.term()
	if err != nil {
		return nil, err
	}
	operands := []node{first}
	op := ""
	for {
		p.skipSpace()
		if p.eof() || p.s[p.pos] == ')' {
			break
		}
		at := p.pos
		w := p.name()
		if w != "AND" && w != "OR" {
			if strings.EqualFold(w, "AND") || strings.EqualFold(w, "OR") {
				return nil, p.errorf(at, "operator %q must be written in uppercase letters", w)
			}
			return nil, p.errorf(at, "expected AND, OR, ')' or the end of the filter, found %s", p.describe(at))
		}
		// The service refuses "a AND b OR c" rather than giving one operator
		// precedence: "To combine the AND and OR operators, use parentheses".
		if op != "" && w != op {
			return nil, p.errorf(at, "%s after %s: use parentheses to combine AND and OR", w, op)
		}
		op = w
		x, err := p.term()
		if err != nil {
			return nil, err
		}
		operands = append(operands, x)
	}
	switch op {
	case "AND":
		return and(operands), nil
	case "OR":
		return or(operands), nil
	}
	return first, nil
}

// term parses a condition, with any number of NOT or - before it.
func (p *parser) term() (node, error) {
	p.skipSpace()
	at := p.pos
	if p.eof() {
		return nil, p.errorf(at, "expected a condition, found the end of the filter")
	}
	switch c := p.s[at]; {
	case c == '-':
		p.pos++
		x, err := p.term()
		if err != nil {
			return nil, err
		}
		return not{x}, nil
	case c == '(':
		p.pos++
		x, err := p.expression()
		if err != nil {
			return nil, err
		}
		if p.eof() {
			return nil, p.errorf(at, "'(' without a matching ')'")
		}
		p.pos++ // the ')' expression stopped at
		return x, nil
	case c == '"':
		return nil, p.errorf(at, `a condition cannot start with a string literal: write attributes.KEY = "VALUE"`)
	case isNameByte(c):
		w := p.name()
		switch w {
		case "NOT":
			x, err := p.term()
			if err != nil {
				return nil, err
			}
			return not{x}, nil
		case "attributes":
			return p.restriction()
		case "hasPrefix":
			return p.hasPrefix()
		}
		switch {
		case w == "AND" || w == "OR":
			return nil, p.errorf(at, "expected a condition before %s", w)
		case strings.EqualFold(w, "NOT"):
			return nil, p.errorf(at, "operator %q must be written in uppercase letters", w)
		}
		p.skipSpace()
		if p.peek('(') {
			return nil, p.errorf(at, "unsupported function %q: hasPrefix is the only function", w)
		}
		return nil, p.errorf(at, "unknown name %q: a condition starts with attributes, hasPrefix, NOT, '-' or '('", w)
	}
	return nil, p.errorf(at, "expected a condition, found %s", p.describe(at))
}

// restriction parses what follows the name attributes: ":" key, or "." key
// then "=" or "!=" and a string literal.
func (p *parser) restriction() (node, error) {
	if p.peek('.') {
		p.pos++
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		p.skipSpace()
		opAt := p.pos
		negated := false
		switch {
		case strings.HasPrefix(p.s[p.pos:], "!="):
			negated = true
			p.pos += 2
		case p.peek('='):
			p.pos++
		default:
			return nil, p.errorf(opAt, "expected '=' or '!=' after attributes.KEY, found %s", p.describe(opAt))
		}
		op := p.s[opAt:p.pos]
		p.skipSpace()
		value, err := p.value(strconv.Quote(op))
		if err != nil {
			return nil, err
		}
		return equals{key: key, value: value, negated: negated}, nil
	}
	p.skipSpace()
	switch {
	case p.peek('.'):
		return nil, p.errorf(p.pos, "no space is allowed before the '.' of attributes.KEY")
	case !p.peek(':'):
		return nil, p.errorf(p.pos, "expected '.' or ':' after attributes, found %s", p.describe(p.pos))
	}
	p.pos++
	p.skipSpace()
	keyAt := p.pos
	key, err := p.key()
	if err != nil {
		return nil, err
	}
	// After ":" an operator is read as one, as the reference fake and the
	// AIP-160 grammar (https://google.aip.dev/assets/misc/ebnf-filtering.txt)
	// do; after "." it is a field name.
	if bare := p.s[keyAt:p.pos]; bare == "AND" || bare == "OR" || bare == "NOT" {
		return nil, p.errorf(keyAt, "expected an attribute name, found operator %s: quote an attribute of that name, as in attributes:\"%s\"", bare, bare)
	}
	return hasAttr{key: key}, nil
}

// hasPrefix parses what follows the name hasPrefix:
// "(" attributes.KEY "," string ")".
func (p *parser) hasPrefix() (node, error) {
	p.skipSpace()
	if !p.peek('(') {
		return nil, p.errorf(p.pos, "expected '(' after hasPrefix, found %s", p.describe(p.pos))
	}
	p.pos++
	p.skipSpace()
	argAt := p.pos
	if p.name() != "attributes" || !p.peek('.') {
		return nil, p.errorf(argAt, "the first argument of hasPrefix must be attributes.KEY, found %s", p.describe(argAt))
	}
	p.pos++
	key, err := p.key()
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if !p.peek(',') {
		return nil, p.errorf(p.pos, "expected ',' after the first argument of hasPrefix, found %s", p.describe(p.pos))
	}
	p.pos++
	p.skipSpace()
	pfx, err := p.value("','")
	if err != nil {
		return nil, err
	}
	p.skipSpace()
	if !p.peek(')') {
		return nil, p.errorf(p.pos, "expected ')' after the second and last argument of hasPrefix, found %s", p.describe(p.pos))
	}
	p.pos++
	return prefix{key: key, prefix: pfx}, nil
}

// key parses an attribute name: a bare name or a string literal.
func (p *parser) key() (string, error) {
	at := p.pos
	if p.peek('"') {
		return p.stringLit()
	}
	if p.peek('-') {
		return "", p.errorf(at, "an attribute name that starts with '-' must be quoted, as in attributes:\"-a\"")
	}
	k := p.name()
	if k == "" {
		return "", p.errorf(at, "expected an attribute name, found %s", p.describe(at))
	}
	// A bare name ends at a character it may not contain; when that is not
	// one that can follow a key, the user most likely meant it to be part of
	// the name.
	if !p.eof() && !isSpace(p.s[p.pos]) && !strings.ContainsRune("=!),:", rune(p.s[p.pos])) {
		return "", p.errorf(p.pos, "attribute name %q is followed by %s: a name with characters other than letters, digits, '-' and '_' must be quoted, as in attributes.\"a.b\"",
			k, p.describe(p.pos))
	}
	return k, nil
}

// value parses the string literal that must come after the operator or
// punctuation named by after.
func (p *parser) value(after string) (string, error) {
	at := p.pos
	if p.peek('"') {
		return p.stringLit()
	}
	if p.name() == "attributes" {
		return "", p.errorf(at, "expected a string literal after %s, found attributes: a filter compares an attribute with a value, not with another attribute", after)
	}
	return "", p.errorf(at, "expected a string literal after %s, found %s", after, p.describe(at))
}

// stringLit parses a double-quoted string literal at p.pos and returns its
// value with the escapes replaced.
func (p *parser) stringLit() (string, error) {
	open := p.pos
	p.pos++
	var b strings.Builder
	for {
		if p.eof() {
			return "", p.errorf(open, "string literal without a closing '\"'")
		}
		r, size := utf8.DecodeRuneInString(p.s[p.pos:])
		switch {
		case r == '"':
			p.pos++
			return b.String(), nil
		case r == '\\':
			if err := p.escape(&b); err != nil {
				return "", err
			}
		case unicode.IsControl(r):
			return "", p.errorf(p.pos, "control character %U in a string literal must be escaped", r)
		default:
			b.WriteString(p.s[p.pos : p.pos+size])
			p.pos += size
		}
	}
}

// escape parses the escape sequence at p.pos (at its backslash) and writes
// the character it stands for to b.
func (p *parser) escape(b *strings.Builder) error {
	at := p.pos
	p.pos++
	if p.eof() {
		return p.errorf(at, "string literal ends in an incomplete escape sequence")
	}
	c, size := utf8.DecodeRuneInString(p.s[p.pos:])
	p.pos += size
	switch c {
	case '\\', '"', '\'', '`', '?':
		b.WriteRune(c)
	case 'a':
		b.WriteByte('\a')
	case 'b':
		b.WriteByte('\b')
	case 'f':
		b.WriteByte('\f')
	case 'n':
		b.WriteByte('\n')
	case 'r':
		b.WriteByte('\r')
	case 't':
		b.WriteByte('\t')
	case 'v':
		b.WriteByte('\v')
	case 'x', 'X':
		r, err := p.digits(at, 2, 16)
		if err != nil {
			return err
		}
		b.WriteRune(r)
	case '0', '1', '2', '3':
		p.pos-- // the first of the three octal digits
		r, err := p.digits(at, 3, 8)
		if err != nil {
			return err
		}
		b.WriteRune(r)
	case 'u':
		r, err := p.digits(at, 4, 16)
		if err != nil {
			return err
		}
		if utf16.IsSurrogate(r) {
			// A code point outside the Basic Multilingual Plane is written
			// as a surrogate pair, \uD83D\uDE00.
			lo := rune(-1)
			if r < 0xDC00 && strings.HasPrefix(p.s[p.pos:], `\u`) {
				save := p.pos
				p.pos += 2
				lo, err = p.digits(save, 4, 16)
				if err != nil {
					return err
				}
			}
			r = utf16.DecodeRune(r, lo)
			if r == unicode.ReplacementChar {
				return p.errorf(at, "escape sequence %s is half of a surrogate pair without its other half", quoteSeq(p.s[at:at+6]))
			}
		}
		b.WriteRune(r)
	case 'U':
		r, err := p.digits(at, 8, 16)
		if err != nil {
			return err
		}
		if utf16.IsSurrogate(r) {
			return p.errorf(at, "escape sequence %s is not a valid code point", quoteSeq(p.s[at:p.pos]))
		}
		b.WriteRune(r)
	default:
		return p.errorf(at, "unknown escape sequence %s in a string literal", quoteSeq(p.s[at:p.pos]))
	}
	return nil
}

// digits reads exactly n digits in base 16 or 8 at p.pos, for the escape
// sequence that starts at the backslash at offset at.
func (p *parser) digits(at, n, base int) (rune, error) {
	kind := "hexadecimal"
	if base == 8 {
		kind = "octal"
	}
	if len(p.s)-p.pos < n {
		return 0, p.errorf(at, "escape sequence %s needs %d %s digits", quoteSeq(p.s[at:]), n, kind)
	}
	v, err := strconv.ParseUint(p.s[p.pos:p.pos+n], base, 64)
	if err != nil || !isDigits(p.s[p.pos:p.pos+n], base) {
		return 0, p.errorf(at, "escape sequence %s needs %d %s digits", quoteSeq(p.s[at:p.pos+n]), n, kind)
	}
	p.pos += n
	if v > unicode.MaxRune {
		return 0, p.errorf(at, "escape sequence %s is not a valid code point", quoteSeq(p.s[at:p.pos]))
	}
	return rune(v), nil
}

// quoteSeq quotes an escape sequence for an error message, in backquotes
// so that its backslash is shown once.
func quoteSeq(s string) string {
	if strconv.CanBackquote(s) {
		return "`" + s + "`"
	}
	return strconv.Quote(s)
}

// isDigits reports whether s has only digits of base 16 or 8 (ParseUint
// alone would also take a sign or underscores in some cases).
func isDigits(s string, base int) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := '0' <= c && c <= '7' ||
			base == 16 && ('8' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F')
		if !ok {
			return false
		}
	}
	return true
}

// name reads a run of name characters at p.pos, possibly empty.
func (p *parser) name() string {
	start := p.pos
	for !p.eof() && isNameByte(p.s[p.pos]) {
		p.pos++
	}
	return p.s[start:p.pos]
}

func (p *parser) skipSpace() {
	for !p.eof() && isSpace(p.s[p.pos]) {
		p.pos++
	}
}

func (p *parser) eof() bool { return p.pos >= len(p.s) }

func (p *parser) peek(c byte) bool { return !p.eof() && p.s[p.pos] == c }

// describe names what is at offset at, for error messages.
func (p *parser) describe(at int) string {
	if at >= len(p.s) {
		return "the end of the filter"
	}
	switch c := p.s[at]; {
	case isNameByte(c):
		end := at
		for end < len(p.s) && isNameByte(p.s[end]) {
			end++
		}
		return strconv.Quote(p.s[at:end])
	case c == '"':
		return "a string literal"
	}
	r, _ := utf8.DecodeRuneInString(p.s[at:])
	return strconv.QuoteRune(r)
}

func (p *parser) errorf(at int, format string, args ...any) error {
	return fmt.Errorf("%w at offset %d: %s", ErrInvalidFilter, at, fmt.Sprintf(format, args...))
}

// isNameByte reports whether c may appear in an unquoted attribute name or
// keyword: "If a key contains characters other than hyphens, underscores,
// or alphanumeric characters, use a string literal."
func isNameByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_'
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'
}
