package filter

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"unicode"
)

// FuzzParse checks that Parse never panics and refuses only with
// ErrInvalidFilter, that a parsed filter's String parses again, and that
// Match never panics and agrees with the filter re-printed in a canonical
// form (every key and value quoted, every non-ASCII character escaped), which
// checks that escapes decode to what they stand for.
func FuzzParse(f *testing.F) {
	seeds := []string{
		``,
		`attributes:name`,
		`attributes:"name"`,
		`attributes : ce-subject`,
		`attributes:"\u307F\u3093\u306A"`,
		`attributes.name = "com"`,
		`attributes.name!="com"`,
		`attributes."iana.org/language_tag" = "en"`,
		`attributes."a key" = "line1\nline2\t\000\xff\?\'\"\\"`,
		`attributes.e = "\U0001F600" OR attributes.e = "\uD83D\uDE00" OR attributes.e = "😀"`,
		`hasPrefix(attributes.name, "co")`,
		`hasPrefix ( attributes."a.b" , "" )`,
		`NOT attributes:name`,
		`-attributes:name AND - attributes:lang`,
		`NOT NOT --attributes:name`,
		`NOT(attributes:name)`,
		`attributes:a AND attributes:b AND attributes:c`,
		`attributes:a OR attributes:b OR attributes:c`,
		`attributes:lang AND (attributes.name = "net" OR attributes.name = "org")`,
		`(attributes.lang = "en" AND attributes.name = "com") OR NOT hasPrefix(attributes.x, "y")`,
		`NOT (attributes:name AND (attributes.lang = "jp" OR NOT (attributes:lang)))`,
		"\n\tattributes:name\n\tAND\r\n\t(attributes.lang\t=\t\"en\"\fOR attributes.lang !=\n\"cn\")\n",
		`attributes:"AND" AND attributes.NOT = "x"`,
		`attributes:a AND attributes:b OR attributes:c`,
		`attributes.name = "com" AND ("net" OR "org")`,
		`"com" = attributes.name`,
		`attributes.name = attributes.website`,
		`attributes.a.b = "x"`,
		`hasSuffix(attributes.name, "x")`,
		`hasPrefix(attributes.name, "a", "b")`,
		`attributes:"abc`,
		`attributes.a = "\uD83D"`,
		`attributes.a = "\U00110000"`,
		`attributes.a = "\400\12\x4\q"`,
		"attributes:\"a\xffb\"",
		`((((((((attributes:a))))))))`,
		strings.Repeat("-", 200) + `attributes:a`,
		strings.Repeat("(", 100) + `attributes:a` + strings.Repeat(")", 100),
		`attributes.name = "` + strings.Repeat("x", 236) + `"`,
	}
	for _, s := range seeds {
		f.Add(s, []byte("com\x01\x82\x13"))
	}
	f.Fuzz(func(t *testing.T, expr string, attrSeed []byte) {
		flt, err := Parse(expr)
		if err != nil {
			if !errors.Is(err, ErrInvalidFilter) {
				t.Fatalf("Parse(%q) error %v does not wrap ErrInvalidFilter", expr, err)
			}
			if flt != nil {
				t.Fatalf("Parse(%q) returned a Filter with its error", expr)
			}
			return
		}
		if flt.String() != expr {
			t.Fatalf("String() = %q, want %q", flt.String(), expr)
		}
		again, err := Parse(flt.String())
		if err != nil {
			t.Fatalf("Parse(String()) of %q: %v", expr, err)
		}
		// The canonical form can be longer than the limit: parse it without.
		canon := format(flt.root)
		root, err := parse(canon)
		if err != nil {
			t.Fatalf("canonical form %q of %q: %v", canon, expr, err)
		}
		if got := format(root); got != canon {
			t.Fatalf("canonical form of %q is %q, re-parsed it prints %q", expr, canon, got)
		}
		reparsed := &Filter{expr: canon, root: root}
		for _, attrs := range attrSets(flt.root, attrSeed) {
			want := flt.Match(attrs)
			if again.Match(attrs) != want || reparsed.Match(attrs) != want {
				t.Fatalf("filter %q (canonical %q) on %q: Match gives different answers", expr, canon, attrs)
			}
		}
	})
}

// format prints a node in a canonical form that parses back to an
// equivalent node: AND and OR groups in parentheses, keys and values quoted.
func format(n node) string {
	switch n := n.(type) {
	case nil:
		return ""
	case hasAttr:
		return "attributes:" + quote(n.key)
	case equals:
		op := " = "
		if n.negated {
			op = " != "
		}
		return "attributes." + quote(n.key) + op + quote(n.value)
	case prefix:
		return "hasPrefix(attributes." + quote(n.key) + ", " + quote(n.prefix) + ")"
	case not:
		return "NOT " + format(n.x)
	case and:
		return group(n, " AND ")
	case or:
		return group(n, " OR ")
	}
	panic(fmt.Sprintf("format: unknown node %T", n))
}

func group(operands []node, op string) string {
	parts := make([]string, len(operands))
	for i, x := range operands {
		parts[i] = format(x)
	}
	return "(" + strings.Join(parts, op) + ")"
}

// quote writes s as a string literal, using each kind of escape: octal for
// ASCII controls, \x up to U+00FF, \u in the BMP and \U beyond.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x80 && unicode.IsControl(r):
			fmt.Fprintf(&b, `\%03o`, r)
		case r < 0x80:
			b.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(&b, `\u%04X`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// attrSets returns attribute maps to match a filter against: none, the keys
// the filter names with the values it names (and near misses), and maps
// that seed picks keys and values for.
func attrSets(root node, seed []byte) []map[string]string {
	var keys, values []string
	var walk func(node)
	walk = func(n node) {
		switch n := n.(type) {
		case hasAttr:
			keys = append(keys, n.key)
		case equals:
			keys = append(keys, n.key)
			values = append(values, n.value, n.value+"z")
		case prefix:
			keys = append(keys, n.key)
			values = append(values, n.prefix, n.prefix+"z", n.prefix[:len(n.prefix)/2])
		case not:
			walk(n.x)
		case and:
			for _, x := range n {
				walk(x)
			}
		case or:
			for _, x := range n {
				walk(x)
			}
		}
	}
	walk(root)
	keys = append(keys, string(seed))
	values = append(values, "", string(seed))

	sets := []map[string]string{nil, {}}
	all := map[string]string{}
	for i, k := range keys {
		all[k] = values[i%len(values)]
	}
	sets = append(sets, all)
	m := map[string]string{}
	for i, b := range seed {
		k := keys[int(b)%len(keys)]
		if b&0x80 != 0 {
			delete(m, k)
		} else {
			m[k] = values[int(b>>2)%len(values)]
		}
		if i%4 == 3 {
			sets = append(sets, maps.Clone(m))
		}
	}
	return append(sets, m)
}
