package filter

import "strings"

// node is a parsed condition. Nodes are never modified after parsing.
type node interface {
	match(attrs map[string]string) bool
}

// hasAttr is attributes:KEY.
type hasAttr struct{ key string }

// equals is attributes.KEY = "VALUE", or != when negated. != is the
// complement of =, so a message without the attribute matches it.
type equals struct {
	key, value string
	negated    bool
}

// prefix is hasPrefix(attributes.KEY, "PREFIX").
type prefix struct{ key, prefix string }

type not struct{ x node }

// and and or hold two or more operands.
type (
	and []node
	or  []node
)

func (n hasAttr) match(attrs map[string]string) bool {
	_, ok := attrs[n.key]
	return ok
}

func (n equals) match(attrs map[string]string) bool {
	v, ok := attrs[n.key]
	return (ok && v == n.value) != n.negated
}

func (n prefix) match(attrs map[string]string) bool {
	v, ok := attrs[n.key]
	return ok && strings.HasPrefix(v, n.prefix)
}

func (n not) match(attrs map[string]string) bool { return !n.x.match(attrs) }

func (n and) match(attrs map[string]string) bool {
	for _, x := range n {
		if !x.match(attrs) {
			return false
		}
	}
	return true
}

func (n or) match(attrs map[string]string) bool {
	for _, x := range n {
		if x.match(attrs) {
			return true
		}
	}
	return false
}
