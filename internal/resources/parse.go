package resources

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
)

// spec lists the fields a resource may give, by the REST API's (JSON)
// names, each with the spec of its own fields when it is a message given
// as a mapping; nil for a field given as one value (a scalar, a duration,
// a map of strings). Fields of the API's resources that are not listed
// are refused as not supported.
type spec map[string]spec

var (
	schemaSpec = spec{"type": nil, "definition": nil}
	topicSpec  = spec{
		"labels":                   nil,
		"messageRetentionDuration": nil,
		"schemaSettings":           {"schema": nil, "encoding": nil, "firstRevisionId": nil, "lastRevisionId": nil},
	}
	subscriptionSpec = spec{
		"topic":                     nil,
		"ackDeadlineSeconds":        nil,
		"retainAckedMessages":       nil,
		"messageRetentionDuration":  nil,
		"labels":                    nil,
		"enableMessageOrdering":     nil,
		"enableExactlyOnceDelivery": nil,
		"filter":                    nil,
		"expirationPolicy":          {"ttl": nil},
		"deadLetterPolicy":          {"deadLetterTopic": nil, "maxDeliveryAttempts": nil},
		"retryPolicy":               {"minimumBackoff": nil, "maximumBackoff": nil},
		"pushConfig": {
			"pushEndpoint":  nil,
			"attributes":    nil,
			"oidcToken":     {"serviceAccountEmail": nil, "audience": nil},
			"pubsubWrapper": {},
			"noWrapper":     {"writeMetadata": nil},
		},
	}
	// required are the fields a declaration must give.
	required = map[string][]string{"schema": {"type", "definition"}, "subscription": {"topic"}}
	// references are the fields that name another resource, by id in the
	// declaration's project or by full name, and the collection they name.
	references = map[string]string{"topic": "topics", "deadLetterPolicy.deadLetterTopic": "topics", "schemaSettings.schema": "schemas"}
)

// given records which fields of a declaration the file gives, with their
// lines: Apply sets those and leaves the others as they are. A field given
// as a mapping has the fields given in it; one given as null is to be
// cleared.
type given struct {
	fd     protoreflect.FieldDescriptor // nil for the declaration itself
	line   int
	null   bool
	fields []*given
}

// maxErrors bounds the problems one Parse reports.
const maxErrors = 20

type parser struct {
	f       *File
	errs    []error
	dropped int
}

func (p *parser) err() error {
	if p.dropped > 0 {
		p.errs = append(p.errs, fmt.Errorf("%s: %d more problems", p.f.Path, p.dropped))
	}
	return errors.Join(p.errs...)
}

// errorf records a problem at n of resource res.
func (p *parser) errorf(n *yaml.Node, res, format string, args ...any) {
	if len(p.errs) >= maxErrors {
		p.dropped++
		return
	}
	e := &Error{File: p.f.Path, Resource: res, Err: ErrInvalid, detail: fmt.Sprintf(format, args...)}
	if n != nil {
		e.Line = n.Line
	}
	p.errs = append(p.errs, e)
}

func (p *parser) parse(data []byte) {
	if looksJSON(data) {
		// YAML takes JSON, but not tabs where it would indent: in valid
		// JSON every tab is whitespace between tokens (a string has \t).
		data = bytes.ReplaceAll(data, []byte("\t"), []byte(" "))
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return // empty: declares nothing
		}
		// yaml's line of a syntax error is where the construct around the
		// problem starts, or the problem's own: its message says it as is.
		p.errs = append(p.errs, &Error{File: p.f.Path, Err: ErrInvalid, detail: "not YAML or JSON: " + strings.TrimPrefix(err.Error(), "yaml: ")})
		return
	}
	var next yaml.Node
	if err := dec.Decode(&next); err != io.EOF {
		p.errs = append(p.errs, &Error{File: p.f.Path, Line: next.Line, Err: ErrInvalid, detail: "a second document: the file must hold one"})
		return
	}
	root := resolve(doc.Content[0])
	if isNull(root) {
		return
	}
	for _, kv := range p.pairs(root, "") {
		if strings.HasPrefix(kv.key.Value, "x-") {
			continue // for anchors, as in compose files
		}
		if kv.key.Value != "projects" {
			p.errorf(kv.key, "", "unknown field %q: the file has projects (and x- keys for anchors)", kv.key.Value)
			continue
		}
		projects := resolve(kv.value)
		if isNull(projects) {
			continue
		}
		for _, pr := range p.pairs(projects, "projects") {
			p.project(pr.key, resolve(pr.value))
		}
	}
}

// looksJSON reports whether data starts as a JSON object does.
func looksJSON(data []byte) bool {
	return bytes.HasPrefix(bytes.TrimLeft(data, " \t\r\n\ufeff"), []byte("{"))
}

func (p *parser) project(key, n *yaml.Node) {
	project := key.Value
	res := fmt.Sprintf("project %q", project)
	if isNull(n) {
		return
	}
	for _, kv := range p.pairs(n, res) {
		kind := strings.TrimSuffix(kv.key.Value, "s")
		var sp spec
		switch kv.key.Value {
		case "schemas":
			sp = schemaSpec
		case "topics":
			sp = topicSpec
		case "subscriptions":
			sp = subscriptionSpec
		default:
			p.errorf(kv.key, res, "unknown field %q: want schemas, topics or subscriptions", kv.key.Value)
			continue
		}
		list := resolve(kv.value)
		if isNull(list) {
			continue
		}
		for _, r := range p.pairs(list, res) {
			p.declaration(kind, project, sp, r.key, resolve(r.value))
		}
	}
}

// declaration parses the declaration of resource id (key) of a kind.
func (p *parser) declaration(kind, project string, sp spec, key, n *yaml.Node) {
	id := key.Value
	res := fmt.Sprintf("%s %q", kind, id)
	d := Decl{Project: project, ID: id, Line: key.Line, given: &given{line: key.Line}}
	var msg proto.Message
	switch kind {
	case "schema":
		s := &Schema{Decl: d, Schema: &pb.Schema{Name: "projects/" + project + "/schemas/" + id}}
		msg = s.Schema
		p.f.Schemas = append(p.f.Schemas, s)
	case "topic":
		t := &Topic{Decl: d, Topic: &pb.Topic{Name: "projects/" + project + "/topics/" + id}}
		msg = t.Topic
		p.f.Topics = append(p.f.Topics, t)
	default:
		s := &Subscription{Decl: d, Subscription: &pb.Subscription{Name: "projects/" + project + "/subscriptions/" + id}}
		msg = s.Subscription
		p.f.Subscriptions = append(p.f.Subscriptions, s)
	}
	if !isNull(n) {
		p.message(n, res, project, "", sp, msg.ProtoReflect(), d.given)
	}
	for _, name := range required[kind] {
		found := false
		for _, g := range d.given.fields {
			found = found || g.fd.JSONName() == name
		}
		if !found {
			p.errorf(key, res, "missing field %q", name)
		}
	}
}

// message sets the fields of m that mapping n gives, as sp allows, and
// records them in g. path is the JSON path of m within the declaration
// ("" for the declaration itself).
func (p *parser) message(n *yaml.Node, res, project, path string, sp spec, m protoreflect.Message, g *given) {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, res, "%swant a mapping of fields, not %s", inField(path), describe(n))
		return
	}
	for _, kv := range p.pairs(n, res) {
		name := kv.key.Value
		full := join(path, name)
		fd := m.Descriptor().Fields().ByJSONName(name)
		sub, allowed := sp[name]
		switch {
		case name == "name" && path == "":
			p.errorf(kv.key, res, "field \"name\": the id is the declaration's key, the project the key above it")
			continue
		case fd == nil && m.Descriptor().Fields().ByName(protoreflect.Name(name)) != nil:
			p.errorf(kv.key, res, "unknown field %q: the file has the REST API's names, %q", full, join(path, m.Descriptor().Fields().ByName(protoreflect.Name(name)).JSONName()))
			continue
		case fd == nil:
			p.errorf(kv.key, res, "unknown field %q", full)
			continue
		case fd.ContainingOneof() != nil && oneofGiven(g, fd) != nil:
			p.errorf(kv.key, res, "fields %q and %q exclude each other", join(path, oneofGiven(g, fd).JSONName()), full)
			continue
		case !allowed:
			p.errorf(kv.key, res, "field %q is not supported by the sidecar", full)
			continue
		}
		v := resolve(kv.value)
		fg := &given{fd: fd, line: kv.key.Line}
		g.fields = append(g.fields, fg)
		if isNull(v) {
			if fd.IsMap() {
				continue // none: an empty mapping (labels the file leaves out of it are removed)
			}
			if fd.Kind() != protoreflect.MessageKind {
				p.errorf(v, res, "field %q: want %s, not null", full, kindOf(fd))
				continue
			}
			fg.null = true // cleared: the API's default holds
			continue
		}
		if sub != nil {
			p.message(v, res, project, full, sub, m.Mutable(fd).Message(), fg)
			continue
		}
		val, ok := p.value(v, res, project, full, fd, m)
		if ok {
			m.Set(fd, val)
		}
	}
}

// oneofGiven is the field of fd's oneof that g already gives, if any.
func oneofGiven(g *given, fd protoreflect.FieldDescriptor) protoreflect.FieldDescriptor {
	for _, c := range g.fields {
		if c.fd.ContainingOneof() == fd.ContainingOneof() {
			return c.fd
		}
	}
	return nil
}

// value decodes the one value of field fd given as n.
func (p *parser) value(n *yaml.Node, res, project, path string, fd protoreflect.FieldDescriptor, m protoreflect.Message) (protoreflect.Value, bool) {
	bad := func() (protoreflect.Value, bool) {
		p.errorf(n, res, "field %q: want %s, not %s", path, kindOf(fd), describe(n))
		return protoreflect.Value{}, false
	}
	if fd.IsMap() {
		if n.Kind != yaml.MappingNode {
			return bad()
		}
		mv := m.NewField(fd).Map()
		for _, kv := range p.pairs(n, res) {
			v := resolve(kv.value)
			if v.Kind != yaml.ScalarNode {
				p.errorf(v, res, "field %q: the value of %q: want a string, not %s", path, kv.key.Value, describe(v))
				continue
			}
			val := v.Value
			if isNull(v) {
				val = ""
			}
			mv.Set(protoreflect.ValueOfString(kv.key.Value).MapKey(), protoreflect.ValueOfString(val))
		}
		return protoreflect.ValueOfMap(mv), true
	}
	if n.Kind != yaml.ScalarNode {
		return bad()
	}
	tag := n.ShortTag()
	switch fd.Kind() {
	case protoreflect.StringKind:
		if coll, ok := references[path]; ok {
			name, err := reference(project, coll, n.Value)
			if err != nil {
				p.errorf(n, res, "field %q: %v", path, err)
				return protoreflect.Value{}, false
			}
			return protoreflect.ValueOfString(name), true
		}
		return protoreflect.ValueOfString(n.Value), true
	case protoreflect.BoolKind:
		var b bool
		if tag != "!!bool" || n.Decode(&b) != nil {
			return bad()
		}
		return protoreflect.ValueOfBool(b), true
	case protoreflect.Int32Kind:
		var i int64
		if tag != "!!int" || n.Decode(&i) != nil {
			return bad()
		}
		if i < -1<<31 || i >= 1<<31 {
			p.errorf(n, res, "field %q: %d is out of range", path, i)
			return protoreflect.Value{}, false
		}
		return protoreflect.ValueOfInt32(int32(i)), true
	case protoreflect.EnumKind:
		ev := fd.Enum().Values().ByName(protoreflect.Name(n.Value))
		if ev == nil || ev.Number() == 0 {
			return bad()
		}
		return protoreflect.ValueOfEnum(ev.Number()), true
	case protoreflect.MessageKind:
		if fd.Message().FullName() != "google.protobuf.Duration" {
			break
		}
		d, err := time.ParseDuration(n.Value)
		if tag != "!!str" || err != nil || d < 0 {
			return bad()
		}
		return protoreflect.ValueOfMessage(durationpb.New(d).ProtoReflect()), true
	}
	return bad() // no field of the specs has another kind
}

// reference is the full name of the resource of collection coll (topics,
// schemas) that value names: an id in project, or a full name.
func reference(project, coll, value string) (string, error) {
	if !strings.Contains(value, "/") {
		if value == "" {
			return "", fmt.Errorf("want a %s id or projects/PROJECT/%s/ID, not \"\"", strings.TrimSuffix(coll, "s"), coll)
		}
		return "projects/" + project + "/" + coll + "/" + value, nil
	}
	parts := strings.Split(value, "/")
	if len(parts) != 4 || parts[0] != "projects" || parts[1] == "" || parts[2] != coll || parts[3] == "" {
		return "", fmt.Errorf("%q: want a %s id or projects/PROJECT/%s/ID", value, strings.TrimSuffix(coll, "s"), coll)
	}
	return value, nil
}

// kindOf says what a field's value must be, for messages.
func kindOf(fd protoreflect.FieldDescriptor) string {
	switch {
	case fd.IsMap():
		return "a mapping of strings"
	case fd.Kind() == protoreflect.BoolKind:
		return "true or false"
	case fd.Kind() == protoreflect.Int32Kind:
		return "an integer"
	case fd.Kind() == protoreflect.EnumKind:
		var names []string
		for i := range fd.Enum().Values().Len() {
			if v := fd.Enum().Values().Get(i); v.Number() != 0 {
				names = append(names, string(v.Name()))
			}
		}
		return strings.Join(names, " or ")
	case fd.Kind() == protoreflect.MessageKind && fd.Message().FullName() == "google.protobuf.Duration":
		return "a duration such as 600s, 10m or 168h"
	case fd.Kind() == protoreflect.MessageKind:
		return "a mapping of fields"
	}
	return "a string"
}

// describe names what n is, for messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	if isNull(n) {
		return "null"
	}
	return strconv.Quote(n.Value)
}

func inField(path string) string {
	if path == "" {
		return ""
	}
	return fmt.Sprintf("field %q: ", path)
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// resolve follows aliases (*anchor) to the node they stand for.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

type pair struct{ key, value *yaml.Node }

// pairs returns the entries of mapping n: its own, then those of the
// mappings merged into it (<<: *anchor) whose keys it does not have. A
// key given twice, or n not a mapping, is a problem of res.
func (p *parser) pairs(n *yaml.Node, res string) []pair {
	if n.Kind != yaml.MappingNode {
		p.errorf(n, res, "want a mapping, not %s", describe(n))
		return nil
	}
	var out []pair
	seen := map[string]*yaml.Node{}
	var merged []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			p.errorf(k, res, "want a name as the key, not %s", describe(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			v = resolve(v)
			if v.Kind == yaml.SequenceNode {
				merged = append(merged, v.Content...)
			} else {
				merged = append(merged, v)
			}
			continue
		}
		if first, ok := seen[k.Value]; ok {
			p.errorf(k, res, "%q given twice (first at line %d)", k.Value, first.Line)
			continue
		}
		seen[k.Value] = k
		out = append(out, pair{k, v})
	}
	for _, m := range merged {
		for _, kv := range p.pairs(resolve(m), res) {
			if _, ok := seen[kv.key.Value]; !ok {
				seen[kv.key.Value] = kv.key
				out = append(out, kv)
			}
		}
	}
	return out
}
