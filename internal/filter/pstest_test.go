package filter

import (
	"strings"
	"testing"

	"cloud.google.com/go/pubsub/v2/pstest"
)

// The reference fake's parser (cloud.google.com/go/pubsub/v2/pstest) is
// permissive: it accepts any identifier or string literal as a condition,
// any function with any arguments, unterminated literals and any escape.
// Where the service's documentation says otherwise this package follows the
// service, and pstestDifferences lists each such filter. The documentation is
// "Filter messages from a subscription",
// https://cloud.google.com/pubsub/docs/subscription-message-filter; the
// quotes below are from it.

// pstestAgreements are filters on which Parse and pstest.ValidateFilter agree.
var pstestAgreements = []struct {
	name   string
	filter string
	valid  bool
}{
	{"has", `attributes:name`, true},
	{"has quoted key", `attributes:"name"`, true},
	{"has spaces around colon", `attributes : name`, true},
	{"has escaped unicode key", `attributes:"\u307F\u3093\u306A"`, true},
	{"has hyphen key", `attributes:ce-subject`, true},
	{"has empty quoted key", `attributes:""`, true},
	{"has dotted quoted key", `attributes:"iana.org/language_tag"`, true},
	{"equals", `attributes.name = "com"`, true},
	{"equals without spaces", `attributes.name="com"`, true},
	{"equals hyphen key", `attributes.ce-subject = "x"`, true},
	{"equals empty value", `attributes.name = ""`, true},
	{"equals escaped quote", `attributes.name = "contains\"quote"`, true},
	{"equals newline escape", `attributes.name = "a\nb"`, true},
	{"equals hex escape", `attributes.name = "\xff"`, true},
	{"equals operator as field", `attributes.NOT = "x"`, true},
	{"not equals", `attributes.name != "com"`, true},
	{"hasPrefix", `hasPrefix(attributes.name, "co")`, true},
	{"hasPrefix space before parenthesis", `hasPrefix (attributes.name, "co")`, true},
	{"NOT", `NOT attributes:name`, true},
	{"NOT without space", `NOT(attributes:name)`, true},
	{"NOT NOT", `NOT NOT attributes:name`, true},
	{"minus", `-attributes:name`, true},
	{"minus space", `- attributes:name`, true},
	{"minus minus", `--attributes:name`, true},
	{"AND", `attributes:a AND attributes:b AND attributes:c`, true},
	{"OR", `attributes:a OR attributes:b OR attributes:c`, true},
	{"AND of OR", `attributes:a AND (attributes:b OR attributes:c)`, true},
	{"OR of AND", `attributes:a OR (attributes:b AND attributes:c)`, true},
	{"all conditions", `attributes.a = "x" AND attributes.b != "y" AND hasPrefix(attributes.c, "z") AND NOT attributes:d`, true},
	{"redundant parentheses", `((attributes:a))`, true},
	{"parentheses touching operators", `(attributes:name)AND(attributes:lang)`, true},
	{"pstest's own test", `(NOT attributes:name) OR attributes.name = "co"`, true},
	{"pstest's minus test", `attributes.name = "com" AND -attributes:"lang"`, true},

	{"value on the left", `"com" = attributes.name`, false},
	{"escape outside a literal", `attributes:\u307F`, false},
	{"single quotes", `attributes.name = 'com'`, false},
	{"bracket index", `attributes["a"] = "x"`, false},
	{"slash in unquoted key", `attributes:iana.org/x`, false},
	{"unicode unquoted key", `attributes:みんな`, false},
	{"space before dot", `attributes .name = "x"`, false},
	{"space after dot", `attributes. name = "x"`, false},
	{"operator as unquoted key", `attributes:AND`, false},
	{"key starting with a hyphen", `attributes:-a`, false},
	{"double equals", `attributes.name == "x"`, false},
	{"no value", `attributes.name =`, false},
	{"no key after colon", `attributes:`, false},
	{"has then equals", `attributes:name = "x"`, false},
	{"two values", `attributes.a = "x" "y"`, false},
	{"text after a quoted key", `attributes:"a"b`, false},
	{"bang after key", `attributes:a!`, false},
	{"lowercase and", `attributes:a and attributes:b`, false},
	{"lowercase not", `not attributes:a`, false},
	{"implicit AND", `attributes:a attributes:b`, false},
	{"operator glued to a condition", `attributes:a ANDattributes:b`, false},
	{"leading AND", `AND attributes:a`, false},
	{"dangling AND", `attributes:a AND`, false},
	{"dangling NOT", `attributes:a AND NOT`, false},
	{"NOT alone", `NOT`, false},
	{"minus alone", `-`, false},
	{"empty parentheses", `()`, false},
	{"unclosed parenthesis", `(attributes:a`, false},
	{"extra closing parenthesis", `attributes:a)`, false},
	{"dollar", `attributes.name = $`, false},
	{"ampersand", `attributes:a & attributes:b`, false},
	{"hasPrefix without parentheses", `hasPrefix attributes.name`, false},
	{"hasPrefix one argument", `hasPrefix(attributes.name)`, false},
	{"hasPrefix three arguments", `hasPrefix(attributes.name, "a", "b")`, false},
	{"hasPrefix not closed", `hasPrefix(attributes.name, "co"`, false},
}

// pstestDifferences are filters on which this package deliberately differs
// from pstest because the service does; valid is this package's answer, and
// pstest gives the other.
var pstestDifferences = []struct {
	name   string
	filter string
	valid  bool
	reason string
}{
	{"empty filter", ``, true, `Subscription.filter: "If empty, then no messages are filtered out"`},
	{"whitespace only", "  \n", true, "an empty expression, as in the AIP-160 grammar (filter : [expression])"},
	{"quoted key after dot", `attributes."iana.org/language_tag" = "en"`, true, `the docs' own example: "If a key contains characters other than hyphens, underscores, or alphanumeric characters, use a string literal"`},
	{"quoted key in hasPrefix", `hasPrefix(attributes."a b", "x")`, true, "hasPrefix(attributes.KEY, ...) takes the same keys as ="},
	{"AND then OR", `attributes:a AND attributes:b OR attributes:c`, false, `"Invalid: AND and OR operators without parentheses"`},
	{"OR then AND", `attributes:a OR attributes:b AND attributes:c`, false, `"To combine the AND and OR operators, use parentheses"`},
	{"incomplete expressions", `attributes.name = "com" AND ("net" OR "org")`, false, `"Invalid: AND and OR operators combine incomplete expressions"`},
	{"two keys", `attributes.name = attributes.website`, false, `"Invalid: Filter compares two keys"`},
	{"unquoted value", `attributes.name = com`, false, `"The value must be a string literal"`},
	{"dotted key unquoted", `attributes.a.b = "x"`, false, "a key with '.' must be a string literal"},
	{"dotted key after colon", `attributes:a.b`, false, "a key with '.' must be a string literal"},
	{"no key", `attributes.= "x"`, false, "no attribute name"},
	{"key without operator", `attributes.name`, false, `"The equality operators match keys and values"; a key alone is no condition`},
	{"colon after key", `attributes.name:"x"`, false, `":" applies to attributes only: "attributes:KEY"`},
	{"bare attributes", `attributes`, false, "no condition"},
	{"bare word", `foo`, false, "the attributes identifier is the only one"},
	{"bare string", `"x"`, false, "a value alone is no condition"},
	{"attributes misspelt", `attribute:name`, false, "the attributes identifier is the only one"},
	{"unsupported function", `hasSuffix(attributes.name, "x")`, false, `"hasPrefix is the only supported function in a filter"`},
	{"hasPrefix is case-sensitive", `HasPrefix(attributes.a, "x")`, false, `"hasPrefix is the only supported function in a filter"`},
	{"hasPrefix arguments swapped", `hasPrefix("co", attributes.name)`, false, `"hasPrefix(attributes.KEY, "SUBSTRING")"`},
	{"hasPrefix of has", `hasPrefix(attributes:name, "co")`, false, `"hasPrefix(attributes.KEY, "SUBSTRING")"`},
	{"hasPrefix unquoted prefix", `hasPrefix(attributes.name, co)`, false, `"hasPrefix(attributes.KEY, "SUBSTRING")"`},
	{"hasPrefix without comma", `hasPrefix(attributes.name "co")`, false, "function arguments are separated by commas"},
	{"unterminated string", `attributes:"abc`, false, "a string literal ends with a quote"},
	{"unknown escape", `attributes.a = "\q"`, false, `only "Unicode, hexadecimal, and octal escape sequences" and character escapes exist`},
	{"escaped multibyte character", `attributes.a = "\é"`, false, "not an escape sequence"},
	{"short octal escape", `attributes.a = "\12"`, false, "an octal escape has three digits"},
	{"short hex escape", `attributes.a = "\x4"`, false, "a hexadecimal escape has two digits"},
	{"lone surrogate", `attributes.a = "\uD800"`, false, "not a Unicode character; filters and attributes are UTF-8"},
	{"code point too big", `attributes.a = "\U00110000"`, false, "not a Unicode character"},
	{"raw control character", "attributes:\"a\tb\"", false, `"To use ... non-printing characters in a filter, escape the characters"`},
	{"raw newline", "attributes.a = \"a\nb\"", false, `"To use ... non-printing characters in a filter, escape the characters"`},
	{"not UTF-8", "attributes:\"a\xffb\"", false, "the filter is a proto3 string, which is UTF-8"},
	{"too long", `attributes.name = "com"` + strings.Repeat(" ", maxFilterBytes), false, `"The maximum length of a filter is 256 bytes"`},
}

func TestAgainstPstest(t *testing.T) {
	for _, tt := range pstestAgreements {
		t.Run("agree/"+tt.name, func(t *testing.T) {
			_, err := Parse(tt.filter)
			perr := pstest.ValidateFilter(tt.filter)
			if (err == nil) != tt.valid || (perr == nil) != tt.valid {
				t.Errorf("filter %q: Parse error %v, pstest error %v; want both valid=%v", tt.filter, err, perr, tt.valid)
			}
		})
	}
	for _, tt := range pstestDifferences {
		t.Run("differ/"+tt.name, func(t *testing.T) {
			_, err := Parse(tt.filter)
			perr := pstest.ValidateFilter(tt.filter)
			if (err == nil) != tt.valid {
				t.Errorf("filter %q: Parse error %v, want valid=%v (%s)", tt.filter, err, tt.valid, tt.reason)
			}
			if (perr == nil) == tt.valid {
				t.Errorf("filter %q: pstest now agrees (error %v): move it to pstestAgreements", tt.filter, perr)
			}
		})
	}
}
