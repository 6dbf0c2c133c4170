package filter

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// messages are the attribute sets every filter in TestParseMatch is matched
// against, by name.
var messages = map[string]map[string]string{
	"nil":        nil,
	"no-attrs":   {},
	"com-en":     {"name": "com", "lang": "en"},
	"net-en":     {"name": "net", "lang": "en"},
	"org-cn":     {"name": "org", "lang": "cn"},
	"co-jp":      {"name": "co", "lang": "jp"},
	"jp":         {"lang": "jp"},
	"com":        {"name": "com"},
	"empty-name": {"name": ""},
	"quote":      {"name": `say "hi"\`},
	"unicode":    {"みんな": "x", "name": "コム"},
	"iana":       {"iana.org/language_tag": "en", "name": "net"},
	"controls":   {"a key": "line1\nline2\t\x00\u00ff"},
	"emoji":      {"e": "😀"},
	"hyphen":     {"ce-subject": "//chat/spaces/AB", "_x-1": "y", "AND": "and", "NOT": "x"},
}

// allBut returns the names of messages other than the given ones.
func allBut(except ...string) []string {
	var names []string
	for name := range messages {
		if !slices.Contains(except, name) {
			names = append(names, name)
		}
	}
	return names
}

var withName = []string{"com-en", "net-en", "org-cn", "co-jp", "com", "empty-name", "quote", "unicode", "iana"}

func TestParseMatch(t *testing.T) {
	tests := []struct {
		name   string
		filter string
		want   []string // names of the messages that match
	}{
		{"empty filter", ``, allBut()},
		{"whitespace only", " \t\r\n", allBut()},

		{"has", `attributes:name`, withName},
		{"has quoted key", `attributes:"name"`, withName},
		{"has spaces around colon", `attributes : name`, withName},
		{"has unicode key", `attributes:"みんな"`, []string{"unicode"}},
		{"has escaped unicode key (docs example)", `attributes:"\u307F\u3093\u306A"`, []string{"unicode"}},
		{"has hyphen key", `attributes:ce-subject`, []string{"hyphen"}},
		{"has key with underscore and digit", `attributes:_x-1`, []string{"hyphen"}},
		{"operator as key", `attributes:"AND" AND attributes.NOT = "x" AND hasPrefix(attributes.OR, "")`, nil},
		{"operator as quoted key or field", `attributes:"AND" AND attributes.NOT = "x"`, []string{"hyphen"}},
		{"has missing key", `attributes:nope`, nil},

		{"equals", `attributes.name = "com"`, []string{"com-en", "com"}},
		{"equals without spaces", `attributes.name="com"`, []string{"com-en", "com"}},
		{"equals empty value", `attributes.name = ""`, []string{"empty-name"}},
		{"equals is case-sensitive", `attributes.name = "COM"`, nil},
		{"equals quoted key (docs example)", `attributes."iana.org/language_tag" = "en"`, []string{"iana"}},
		{"equals key with a space and escaped controls", `attributes."a key" = "line1\nline2\t\000\xff"`, []string{"controls"}},
		{"equals octal and hex escapes", `attributes.name = "\x63\157\X6d"`, []string{"com-en", "com"}},
		{"equals escaped quote and backslash", `attributes.name = "say \"hi\"\\"`, []string{"quote"}},
		{"equals other punctuation escapes", `attributes.name = "\'\?\x60" OR attributes.name = "com"`, []string{"com-en", "com"}},
		{"equals raw unicode value", `attributes.name = "コム"`, []string{"unicode"}},
		{"equals \\u escaped value", `attributes.name = "\u30b3\u30E0"`, []string{"unicode"}},
		{"equals \\U escaped value", `attributes.e = "\U0001F600"`, []string{"emoji"}},
		{"equals surrogate pair", `attributes.e = "\uD83D\uDE00"`, []string{"emoji"}},
		{"equals raw emoji", `attributes.e = "😀"`, []string{"emoji"}},
		{"equals hyphen key", `attributes.ce-subject = "//chat/spaces/AB"`, []string{"hyphen"}},
		{"equals on missing attribute", `attributes.nope = ""`, nil},

		{"not equals matches missing attribute", `attributes.name != "com"`, allBut("com-en", "com")},
		{"not equals without spaces", `attributes.name!="com"`, allBut("com-en", "com")},
		{"not equals is NOT equals", `NOT attributes.name = "com"`, allBut("com-en", "com")},

		{"hasPrefix", `hasPrefix(attributes.name, "co")`, []string{"com-en", "co-jp", "com"}},
		{"hasPrefix empty prefix is has", `hasPrefix(attributes.name, "")`, withName},
		{"hasPrefix whole value", `hasPrefix(attributes.name, "com")`, []string{"com-en", "com"}},
		{"hasPrefix longer than value", `hasPrefix(attributes.name, "comm")`, nil},
		{"hasPrefix with spaces", "hasPrefix ( attributes.name ,\t\"co\" )", []string{"com-en", "co-jp", "com"}},
		{"hasPrefix quoted key", `hasPrefix(attributes."iana.org/language_tag", "e")`, []string{"iana"}},
		{"hasPrefix hyphen key", `hasPrefix(attributes.ce-subject, "//chat/")`, []string{"hyphen"}},
		{"NOT hasPrefix matches missing attribute", `NOT hasPrefix(attributes.name, "co")`, allBut("com-en", "co-jp", "com")},

		{"NOT", `NOT attributes:name`, allBut(withName...)},
		{"minus", `-attributes:name`, allBut(withName...)},
		{"minus then space", `- attributes:name`, allBut(withName...)},
		{"NOT then parenthesis without space", `NOT(attributes:name)`, allBut(withName...)},
		{"NOT NOT", `NOT NOT attributes:name`, withName},
		{"NOT minus", `NOT -attributes:name`, withName},
		{"minus minus", `--attributes:name`, withName},

		{"AND", `attributes:name AND attributes.lang = "en"`, []string{"com-en", "net-en"}},
		{"AND chain", `attributes:name AND attributes:lang AND hasPrefix(attributes.lang, "e")`, []string{"com-en", "net-en"}},
		{"OR", `attributes.name = "org" OR attributes.lang = "jp"`, []string{"org-cn", "co-jp", "jp"}},
		{"OR chain", `attributes.name = "org" OR attributes.lang = "jp" OR attributes:e`, []string{"org-cn", "co-jp", "jp", "emoji"}},
		{"NOT binds tighter than AND", `NOT attributes:name AND attributes:lang`, []string{"jp"}},
		{"NOT binds tighter than OR", `NOT attributes:lang OR attributes.name = "net"`, allBut("com-en", "org-cn", "co-jp", "jp")},
		{"minus binds tighter than AND (docs example)", `attributes.name = "com" AND -attributes:lang`, []string{"com"}},
		{"AND of OR in parentheses (docs example)", `attributes:lang AND (attributes.name = "net" OR attributes.name = "org")`, []string{"net-en", "org-cn"}},
		{"OR of AND in parentheses", `(attributes.lang = "en" AND attributes.name = "com") OR attributes:"みんな"`, []string{"com-en", "unicode"}},
		{"docs example with AND NOT", `attributes:"iana.org/language_tag" AND NOT attributes.name = "com"`, []string{"iana"}},
		{"redundant parentheses", `((((attributes:e))))`, []string{"emoji"}},
		{"nested parentheses", `NOT (attributes:name AND (attributes.lang = "jp" OR NOT (attributes:lang)))`, allBut("co-jp", "com", "empty-name", "quote", "unicode", "iana")},
		{"parentheses touching operators", `(attributes:name)AND(attributes.lang="jp")`, []string{"co-jp"}},
		{"AND groups of OR groups", `(attributes.name = "com" OR attributes.name = "net") AND (attributes.lang = "en" OR attributes:e)`, []string{"com-en", "net-en"}},
		{"newlines and tabs between tokens", "\n\tattributes:name\n\tAND\r\n\t(attributes.lang\t=\t\"en\"\fOR attributes.lang !=\n\"cn\")\n", []string{"com-en", "net-en", "co-jp", "com", "empty-name", "quote", "unicode", "iana"}},
		{"at the length limit", `attributes.name = "` + strings.Repeat("x", 256-20) + `"`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse(tt.filter)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.filter, err)
			}
			if f.String() != tt.filter {
				t.Errorf("String() = %q, want %q", f.String(), tt.filter)
			}
			var got []string
			for name, attrs := range messages {
				if f.Match(attrs) {
					got = append(got, name)
				}
			}
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tt.want))
			if !slices.Equal(got, want) {
				t.Errorf("Parse(%q) matches %v, want %v", tt.filter, got, want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name   string
		filter string
		want   string // a part of the error message
	}{
		{"too long", `attributes.name = "` + strings.Repeat("x", 257-20) + `"`, "the filter is 257 bytes, the limit is 256 bytes"},
		{"not UTF-8", "attributes:\"a\xffb\"", "at offset 13: the filter is not valid UTF-8"},

		// "To combine the AND and OR operators, use parentheses".
		{"AND then OR (docs example)", `attributes:"iana.org/language_tag" AND attributes.name = "net" OR attributes.name = "org"`, "at offset 63: OR after AND: use parentheses"},
		{"OR then AND", `attributes:a OR attributes:b AND attributes:c`, "at offset 29: AND after OR"},
		{"mixed inside parentheses", `attributes:a AND (attributes:b OR attributes:c AND attributes:d)`, "AND after OR"},
		{"incomplete expressions (docs example)", `attributes.name = "com" AND ("net" OR "org")`, "at offset 29: a condition cannot start with a string literal"},
		{"value on the left (docs example)", `"com" = attributes.name`, "at offset 0: a condition cannot start with a string literal"},
		{"two keys (docs example)", `attributes.name = attributes.website`, "not with another attribute"},
		{"escape outside a literal (docs example)", `attributes:\u307F\u3093\u306A`, `at offset 11: expected an attribute name, found '\\'`},
		{"unquoted value", `attributes.name = com`, `expected a string literal after "=", found "com"`},
		{"single-quoted value", `attributes.name = 'com'`, `expected a string literal after "=", found '\''`},
		{"backquoted key", "attributes.`a b` = \"x\"", "expected an attribute name, found '`'"},
		{"bracket index", `attributes["ce-subject"] = "x"`, "expected '.' or ':' after attributes, found '['"},
		{"dotted key unquoted", `attributes.a.b = "x"`, `at offset 12: attribute name "a" is followed by '.'`},
		{"slash in key unquoted", `attributes:iana.org/language_tag`, "must be quoted"},
		{"unicode key unquoted", `attributes:みんな`, "expected an attribute name, found 'み'"},
		{"space before dot", `attributes .name = "x"`, "no space is allowed before the '.'"},
		{"space after dot", `attributes. name = "x"`, "expected an attribute name, found ' '"},
		{"no key", `attributes.= "x"`, "expected an attribute name, found '='"},
		{"operator as unquoted key", `attributes:AND`, `at offset 11: expected an attribute name, found operator AND: quote`},
		{"key starting with a hyphen", `attributes:-a`, `attribute name that starts with '-' must be quoted`},
		{"no operator", `attributes.name`, "at offset 15: expected '=' or '!=' after attributes.KEY, found the end of the filter"},
		{"colon after key", `attributes.name:"x"`, "expected '=' or '!='"},
		{"double equals", `attributes.name == "x"`, `expected a string literal after "=", found '='`},
		{"bang alone", `attributes.name ! "x"`, "expected '=' or '!='"},
		{"no value", `attributes.name =`, `expected a string literal after "=", found the end of the filter`},
		{"no key after colon", `attributes:`, "expected an attribute name, found the end of the filter"},
		{"bare attributes", `attributes`, "expected '.' or ':' after attributes"},
		{"bare word", `foo`, `at offset 0: unknown name "foo"`},
		{"attributes misspelt", `attribute:name`, `unknown name "attribute"`},

		{"lowercase and", `attributes:a and attributes:b`, `at offset 13: operator "and" must be written in uppercase letters`},
		{"lowercase or", `attributes:a Or attributes:b`, `operator "Or" must be written in uppercase`},
		{"lowercase not", `not attributes:a`, `operator "not" must be written in uppercase`},
		{"implicit AND", `attributes:a attributes:b`, `at offset 13: expected AND, OR, ')' or the end of the filter, found "attributes"`},
		{"operator glued to a condition", `attributes:a ANDattributes:b`, `found "ANDattributes"`},
		{"leading AND", `AND attributes:a`, "expected a condition before AND"},
		{"dangling AND", `attributes:a AND`, "at offset 16: expected a condition, found the end of the filter"},
		{"dangling NOT", `attributes:a AND NOT`, "expected a condition, found the end of the filter"},
		{"minus alone", `-`, "expected a condition, found the end of the filter"},
		{"empty parentheses", `()`, "at offset 1: expected a condition, found ')'"},
		{"unclosed parenthesis", `(attributes:a`, "at offset 0: '(' without a matching ')'"},
		{"unclosed nested parenthesis", `(attributes:a AND (attributes:b)`, "at offset 0: '(' without a matching ')'"},
		{"extra closing parenthesis", `attributes:a)`, "at offset 12: ')' without a matching '('"},
		{"dollar", `attributes.name = $`, `found '$'`},
		{"stray character", `attributes:a & attributes:b`, "found '&'"},

		{"unsupported function", `hasSuffix(attributes.name, "x")`, `unsupported function "hasSuffix": hasPrefix is the only function`},
		{"hasPrefix is case-sensitive", `HasPrefix(attributes.name, "x")`, `unsupported function "HasPrefix"`},
		{"hasPrefix without parentheses", `hasPrefix attributes.name`, "expected '(' after hasPrefix"},
		{"hasPrefix one argument", `hasPrefix(attributes.name)`, "expected ',' after the first argument of hasPrefix, found ')'"},
		{"hasPrefix three arguments", `hasPrefix(attributes.name, "a", "b")`, "expected ')' after the second and last argument of hasPrefix, found ','"},
		{"hasPrefix arguments swapped", `hasPrefix("co", attributes.name)`, "the first argument of hasPrefix must be attributes.KEY"},
		{"hasPrefix of attributes", `hasPrefix(attributes:name, "co")`, "the first argument of hasPrefix must be attributes.KEY"},
		{"hasPrefix unquoted prefix", `hasPrefix(attributes.name, co)`, `expected a string literal after ',', found "co"`},
		{"hasPrefix not closed", `hasPrefix(attributes.name, "co"`, "expected ')' after the second and last argument"},

		{"unterminated string", `attributes:"abc`, `at offset 11: string literal without a closing '"'`},
		{"unterminated after escaped quote", `attributes.a = "abc\"`, "string literal without a closing"},
		{"escape at the end", `attributes.a = "abc\`, "incomplete escape sequence"},
		{"unknown escape", `attributes.a = "\q"`, "at offset 16: unknown escape sequence `\\q`"},
		{"unknown escape of a multibyte character", `attributes.a = "\é"`, "unknown escape sequence `\\é`"},
		{"octal escape out of range", `attributes.a = "\400"`, "unknown escape sequence `\\4`"},
		{"short octal escape", `attributes.a = "\12"`, "escape sequence `\\12\"` needs 3 octal digits"},
		{"non-octal digit", `attributes.a = "\018"`, "needs 3 octal digits"},
		{"short hex escape", `attributes.a = "\x4"`, "needs 2 hexadecimal digits"},
		{"bad hex escape", `attributes.a = "\xZZ"`, "escape sequence `\\xZZ` needs 2 hexadecimal digits"},
		{"signed hex escape", `attributes.a = "\u+123"`, "needs 4 hexadecimal digits"},
		{"lone high surrogate", `attributes.a = "\uD83D"`, "escape sequence `\\uD83D` is half of a surrogate pair"},
		{"high surrogate then other escape", `attributes.a = "\uD83D\u0041"`, "half of a surrogate pair"},
		{"lone low surrogate", `attributes.a = "\uDE00"`, "half of a surrogate pair"},
		{"big \\U escape", `attributes.a = "\U00110000"`, "escape sequence `\\U00110000` is not a valid code point"},
		{"huge \\U escape", `attributes.a = "\UFFFFFFFF"`, "is not a valid code point"},
		{"surrogate \\U escape", `attributes.a = "\U0000D800"`, "is not a valid code point"},
		{"raw newline in a literal", "attributes.a = \"a\nb\"", "at offset 17: control character U+000A in a string literal must be escaped"},
		{"raw tab in a literal", "attributes:\"a\tb\"", "control character U+0009"},
		{"raw C1 control in a literal", "attributes:\"a\u0085b\"", "control character U+0085"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := Parse(tt.filter)
			if !errors.Is(err, ErrInvalidFilter) {
				t.Fatalf("Parse(%q) error = %v, want ErrInvalidFilter", tt.filter, err)
			}
			if f != nil {
				t.Errorf("Parse(%q) returned a Filter with its error", tt.filter)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%q) error = %q, want it to contain %q", tt.filter, err, tt.want)
			}
		})
	}
}

func TestNilFilter(t *testing.T) {
	var f *Filter
	if !f.Match(map[string]string{"a": "b"}) || !f.Match(nil) {
		t.Error("a nil *Filter must match every message")
	}
	if f.String() != "" {
		t.Errorf("nil String() = %q", f.String())
	}
}

func TestMatchConcurrent(t *testing.T) {
	f, err := Parse(`attributes:lang AND (attributes.name = "net" OR NOT hasPrefix(attributes.name, "c"))`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for name, attrs := range messages {
		want[name] = f.Match(attrs)
	}
	const workers = 8
	mismatches := make(chan string, workers)
	for range workers {
		go func() {
			bad := ""
			for range 200 {
				for name, attrs := range messages {
					if f.Match(attrs) != want[name] {
						bad = name
					}
				}
			}
			mismatches <- bad
		}()
	}
	for range workers {
		if bad := <-mismatches; bad != "" {
			t.Errorf("concurrent Match of %q differs from the sequential result", bad)
		}
	}
}
