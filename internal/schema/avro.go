package schema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/linkedin/goavro/v2"
)

// compileAvro checks definition with goavro, which decodes messages, and
// parses it again into avroType, which Compatible walks (goavro does not
// expose its parsed schema).
func compileAvro(definition string) (*Schema, error) {
	codec, err := goavro.NewCodec(definition)
	if err != nil {
		return nil, fmt.Errorf("%w: not an Avro schema: %v", ErrInvalidSchema, err)
	}
	var v any
	if err := json.Unmarshal([]byte(definition), &v); err != nil {
		return nil, fmt.Errorf("%w: not an Avro schema: %v", ErrInvalidSchema, err)
	}
	p := avroParser{named: map[string]*avroType{}}
	t, err := p.parse(v, "")
	if err != nil {
		return nil, fmt.Errorf("%w: not an Avro schema: %v", ErrInvalidSchema, err)
	}
	return &Schema{typ: pb.Schema_AVRO, codec: codec, avro: t}, nil
}

func (s *Schema) validateAvro(enc pb.Encoding, data []byte) error {
	var rest []byte
	var err error
	if enc == pb.Encoding_BINARY {
		_, rest, err = s.codec.NativeFromBinary(data)
	} else {
		_, rest, err = s.codec.NativeFromTextual(data)
		rest = bytes.TrimSpace(rest)
	}
	if err != nil {
		return fmt.Errorf("%w: not a message of the Avro schema in %s: %v", ErrInvalidMessage, encodingName(enc), err)
	}
	if len(rest) > 0 {
		// The service says "Too much data to parse for schema."
		return fmt.Errorf("%w: too much data to parse for the Avro schema in %s: %d bytes left after the message", ErrInvalidMessage, encodingName(enc), len(rest))
	}
	return nil
}

// avroType is the part of an Avro schema that schema resolution looks at.
type avroType struct {
	kind    string // a primitive type name, or record, enum, array, map, fixed, union
	name    string // unqualified name of a named type
	aliases []string

	fields     []avroField // record
	symbols    []string    // enum
	hasDefault bool        // enum
	items      *avroType   // array
	values     *avroType   // map
	branches   []*avroType // union
	size       int         // fixed
}

type avroField struct {
	name       string
	aliases    []string
	typ        *avroType
	hasDefault bool
}

var avroPrimitives = []string{"null", "boolean", "int", "long", "float", "double", "bytes", "string"}

type avroParser struct {
	named map[string]*avroType // by full name
}

// parse reads a schema (a JSON value) declared in namespace ns.
func (p *avroParser) parse(v any, ns string) (*avroType, error) {
	switch v := v.(type) {
	case string:
		if slices.Contains(avroPrimitives, v) {
			return &avroType{kind: v}, nil
		}
		if t := p.lookup(v, ns); t != nil {
			return t, nil
		}
		return nil, fmt.Errorf("unknown type %q", v)
	case []any:
		u := &avroType{kind: "union"}
		for _, b := range v {
			t, err := p.parse(b, ns)
			if err != nil {
				return nil, err
			}
			u.branches = append(u.branches, t)
		}
		return u, nil
	case map[string]any:
		return p.parseObject(v, ns)
	}
	return nil, fmt.Errorf("unexpected %T in a schema", v)
}

func (p *avroParser) parseObject(o map[string]any, ns string) (*avroType, error) {
	kind, ok := o["type"].(string)
	if !ok {
		// {"type": {...}} or {"type": [...]}: the type is the inner schema.
		return p.parse(o["type"], ns)
	}
	switch kind {
	case "record", "error", "enum", "fixed":
		t := &avroType{kind: kind, aliases: stringList(o["aliases"])}
		if kind == "error" {
			t.kind = "record"
		}
		full, inner := fullName(str(o["name"]), o["namespace"], ns)
		t.name = full[strings.LastIndex(full, ".")+1:]
		for i, a := range t.aliases {
			t.aliases[i] = a[strings.LastIndex(a, ".")+1:]
		}
		p.named[full] = t // before the fields: a record may refer to itself
		switch t.kind {
		case "record":
			fields, _ := o["fields"].([]any)
			for _, f := range fields {
				fo, ok := f.(map[string]any)
				if !ok {
					return nil, fmt.Errorf("record %s: a field is not an object", full)
				}
				ft, err := p.parse(fo["type"], inner)
				if err != nil {
					return nil, fmt.Errorf("record %s, field %s: %w", full, str(fo["name"]), err)
				}
				_, hasDefault := fo["default"]
				t.fields = append(t.fields, avroField{name: str(fo["name"]), aliases: stringList(fo["aliases"]), typ: ft, hasDefault: hasDefault})
			}
		case "enum":
			t.symbols = stringList(o["symbols"])
			_, t.hasDefault = o["default"]
		case "fixed":
			size, _ := o["size"].(float64)
			t.size = int(size)
		}
		return t, nil
	case "array":
		items, err := p.parse(o["items"], ns)
		if err != nil {
			return nil, err
		}
		return &avroType{kind: "array", items: items}, nil
	case "map":
		values, err := p.parse(o["values"], ns)
		if err != nil {
			return nil, err
		}
		return &avroType{kind: "map", values: values}, nil
	}
	// A primitive, perhaps with a logicalType: resolution looks at the
	// underlying type.
	return p.parse(kind, ns)
}

// lookup resolves a reference to a named type from namespace ns.
func (p *avroParser) lookup(name, ns string) *avroType {
	if !strings.Contains(name, ".") && ns != "" {
		if t := p.named[ns+"."+name]; t != nil {
			return t
		}
	}
	return p.named[name]
}

// fullName is the full name of a named type and the namespace its
// fields' types are declared in.
func fullName(name string, namespace any, enclosing string) (full, ns string) {
	if i := strings.LastIndex(name, "."); i >= 0 {
		return name, name[:i]
	}
	ns = enclosing
	if s, ok := namespace.(string); ok {
		ns = s
	}
	if ns == "" {
		return name, ""
	}
	return ns + "." + name, ns
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func stringList(v any) []string {
	l, _ := v.([]any)
	var out []string
	for _, x := range l {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func (t *avroType) String() string {
	if t.name != "" {
		return t.kind + " " + t.name
	}
	return t.kind
}

// avroPromotions lists, for a writer's primitive type, the reader types
// that can read it (Avro specification, "Schema Resolution").
var avroPromotions = map[string][]string{
	"int":    {"long", "float", "double"},
	"long":   {"float", "double"},
	"float":  {"double"},
	"string": {"bytes"},
	"bytes":  {"string"},
}

// avroCanRead reports whether data written with schema w can be read with
// schema r, by the Avro specification's schema resolution rules.
func avroCanRead(r, w *avroType) error {
	return canRead(r, w, map[[2]*avroType]bool{})
}

func canRead(r, w *avroType, seen map[[2]*avroType]bool) error {
	if w.kind == "union" {
		for _, b := range w.branches {
			if err := canRead(r, b, seen); err != nil {
				return err
			}
		}
		return nil
	}
	if r.kind == "union" {
		for _, b := range r.branches {
			if canRead(b, w, seen) == nil {
				return nil
			}
		}
		return fmt.Errorf("no branch of union %v can read %v", r.branches, w)
	}
	if r.kind != w.kind {
		if slices.Contains(avroPromotions[w.kind], r.kind) {
			return nil
		}
		return fmt.Errorf("%v cannot read %v", r, w)
	}
	switch r.kind {
	case "record", "enum", "fixed":
		if r.name != w.name && !slices.Contains(r.aliases, w.name) {
			return fmt.Errorf("%v cannot read %v: the names differ", r, w)
		}
	}
	switch r.kind {
	case "record":
		pair := [2]*avroType{r, w}
		if seen[pair] {
			return nil
		}
		seen[pair] = true
		for _, rf := range r.fields {
			wf := findField(w.fields, rf)
			if wf == nil {
				if !rf.hasDefault {
					return fmt.Errorf("field %s.%s has no default and is missing on the other side", r.name, rf.name)
				}
				continue
			}
			if err := canRead(rf.typ, wf.typ, seen); err != nil {
				return fmt.Errorf("field %s.%s: %w", r.name, rf.name, err)
			}
		}
	case "enum":
		if !r.hasDefault {
			for _, s := range w.symbols {
				if !slices.Contains(r.symbols, s) {
					return fmt.Errorf("enum %s has no symbol %s and no default", r.name, s)
				}
			}
		}
	case "fixed":
		if r.size != w.size {
			return fmt.Errorf("fixed %s changes size from %d to %d", r.name, w.size, r.size)
		}
	case "array":
		return canRead(r.items, w.items, seen)
	case "map":
		return canRead(r.values, w.values, seen)
	}
	return nil
}

// findField is the writer's field a reader's field reads: by name, or by
// one of the reader field's aliases.
func findField(fields []avroField, rf avroField) *avroField {
	for i, f := range fields {
		if f.name == rf.name || slices.Contains(rf.aliases, f.name) {
			return &fields[i]
		}
	}
	return nil
}
