// Package filter implements the Google Cloud Pub/Sub subscription filter
// language: a filter is parsed once, when the subscription is created, and
// then evaluated against the attributes of each message. A subscription
// delivers the messages that match its filter and acknowledges the others
// without delivering them.
//
// The language is the service's, as documented in "Filter messages from a
// subscription" (https://cloud.google.com/pubsub/docs/subscription-message-filter):
//
//	filter     = [ expression ]                      at most 256 bytes
//	expression = term { "AND" term }
//	           | term { "OR" term }                  AND and OR are not mixed without parentheses
//	term       = { "NOT" | "-" } simple              negation binds tightest
//	simple     = "(" expression ")"
//	           | "attributes" ":" key                the message has the attribute
//	           | "attributes" "." key "=" string     it has it, with this value
//	           | "attributes" "." key "!=" string    it has not got it with this value
//	           | "hasPrefix" "(" "attributes" "." key "," string ")"
//	key        = name | string
//	name       = ( ASCII letter | digit | "_" ) { ASCII letter | digit | "-" | "_" }
//	                                                 not AND, OR or NOT after ":"
//	string     = '"' { character | escape } '"'
//
// Operators and the function name are case-sensitive. Whitespace (space, tab,
// CR, LF, FF) may separate tokens, but not the "." of attributes.KEY. Keys
// with other characters than letters, digits, "-" and "_" are written as
// string literals: attributes."iana.org/language_tag" = "en".
//
// The service's documentation asks for escapes for "backslashes, quotation
// marks, and non-printing characters" and allows "Unicode, hexadecimal, and
// octal escape sequences" without listing them; this package takes those of
// string literals in Google's Common Expression Language
// (https://github.com/google/cel-spec/blob/master/doc/langdef.md#string-and-bytes-values):
// \\ \" \' \` \? \a \b \f \n \r \t \v, \xHH or \XHH and \OOO (a code point,
// 000 to 377 for octal), \uHHHH (with surrogate pairs for the other planes)
// and \UHHHHHHHH. Control characters in a literal must be escaped.
//
// A message without the attribute does not match attributes.KEY = "v" nor
// hasPrefix(attributes.KEY, "p"), and does match attributes.KEY != "v": the
// documentation describes != as selecting "messages without the name
// attribute and the value of com", the complement of =.
package filter

import "fmt"

// maxFilterBytes is the service's limit: "The maximum length of a filter is
// 256 bytes."
const maxFilterBytes = 256

// Filter is a parsed subscription filter. It is immutable, so one Filter can
// be shared by any number of goroutines.
type Filter struct {
	expr string
	root node // nil for the empty filter, which matches every message
}

// Parse parses a filter expression. The empty filter (or one of whitespace
// only) is valid and matches every message, as a subscription without a
// filter does. Every error Parse returns wraps ErrInvalidFilter and says
// what is wrong and at which byte offset; on error the *Filter is nil.
func Parse(expr string) (*Filter, error) {
	if len(expr) > maxFilterBytes {
		return nil, fmt.Errorf("%w: the filter is %d bytes, the limit is %d bytes",
			ErrInvalidFilter, len(expr), maxFilterBytes)
	}
	root, err := parse(expr)
	if err != nil {
		return nil, err
	}
	return &Filter{expr: expr, root: root}, nil
}

// Match reports whether a message with these attributes passes the filter.
// A nil map is a message without attributes; a nil *Filter matches every
// message. Match does not modify attrs and is safe for concurrent use.
func (f *Filter) Match(attrs map[string]string) bool {
	if f == nil || f.root == nil {
		return true
	}
	return f.root.match(attrs)
}

// String returns the expression as it was given to Parse ("" for a nil
// *Filter).
func (f *Filter) String() string {
	if f == nil {
		return ""
	}
	return f.expr
}
