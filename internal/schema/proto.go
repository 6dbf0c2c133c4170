package schema

import (
	"context"
	"fmt"
	"strings"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/bufbuild/protocompile"
	"github.com/bufbuild/protocompile/parser"
	"github.com/bufbuild/protocompile/reporter"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// protoFile is the name the definition is compiled under; it shows in
// compiler messages.
const protoFile = "schema.proto"

// compileProto compiles a .proto definition with the service's rules: one
// top-level type, which is a message; no imports; proto2 or proto3.
func compileProto(definition string) (*Schema, error) {
	// Parse first, so that an import is refused as such rather than as a
	// file the compiler cannot find.
	h := reporter.NewHandler(nil)
	node, err := parser.Parse(protoFile, strings.NewReader(definition), h)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSchema, err)
	}
	res, err := parser.ResultFromAST(node, true, h)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSchema, err)
	}
	if deps := res.FileDescriptorProto().GetDependency(); len(deps) > 0 {
		return nil, fmt.Errorf("%w: imports are not supported (import %q); define every type inside the one top-level message", ErrInvalidSchema, deps[0])
	}
	c := protocompile.Compiler{
		Resolver: protocompile.ResolverFunc(func(path string) (protocompile.SearchResult, error) {
			if path != protoFile {
				return protocompile.SearchResult{}, fmt.Errorf("imports are not supported (import %q)", path)
			}
			return protocompile.SearchResult{ParseResult: res}, nil
		}),
		MaxParallelism: 1,
	}
	files, err := c.Compile(context.Background(), protoFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidSchema, err)
	}
	fd := files[0]
	if fd.Syntax() != protoreflect.Proto2 && fd.Syntax() != protoreflect.Proto3 {
		return nil, fmt.Errorf("%w: only proto2 and proto3 are supported, not %v", ErrInvalidSchema, fd.Syntax())
	}
	if n := fd.Messages().Len() + fd.Enums().Len(); n != 1 || fd.Messages().Len() != 1 {
		return nil, fmt.Errorf("%w: a Protocol Buffer schema must define exactly one top-level type, a message, not %d messages and %d enums "+
			"(nest the other types inside it)", ErrInvalidSchema, fd.Messages().Len(), fd.Enums().Len())
	}
	return &Schema{typ: pb.Schema_PROTOCOL_BUFFER, msg: fd.Messages().Get(0)}, nil
}

func compileDescriptorSet(compiled []byte, rootMessage string) (*Schema, error) {
	var set descriptorpb.FileDescriptorSet
	if err := proto.Unmarshal(compiled, &set); err != nil {
		return nil, fmt.Errorf("%w: compiled_bytes is not a FileDescriptorSet: %v", ErrInvalidSchema, err)
	}
	files, err := protodesc.NewFiles(&set)
	if err != nil {
		return nil, fmt.Errorf("%w: compiled_bytes: %v", ErrInvalidSchema, err)
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(strings.TrimPrefix(rootMessage, ".")))
	if err != nil {
		return nil, fmt.Errorf("%w: root_message %q is not in compiled_bytes", ErrInvalidSchema, rootMessage)
	}
	md, ok := d.(protoreflect.MessageDescriptor)
	if !ok {
		return nil, fmt.Errorf("%w: root_message %q is not a message", ErrInvalidSchema, rootMessage)
	}
	return &Schema{typ: pb.Schema_PROTOCOL_BUFFER, msg: md}, nil
}

func (s *Schema) validateProto(enc pb.Encoding, data []byte) error {
	m := dynamicpb.NewMessage(s.msg)
	var err error
	if enc == pb.Encoding_BINARY {
		// Unknown fields are kept, as any protobuf parser does; proto2
		// required fields must be present.
		err = proto.Unmarshal(data, m)
	} else {
		err = protojson.Unmarshal(data, m)
	}
	if err != nil {
		return fmt.Errorf("%w: not a %s message in %s: %v", ErrInvalidMessage, s.msg.FullName(), encodingName(enc), cleanProtoErr(err))
	}
	return nil
}

// cleanProtoErr drops the "proto: " prefix the protobuf runtime adds.
func cleanProtoErr(err error) string {
	return strings.TrimPrefix(strings.TrimPrefix(err.Error(), "proto:"), "\u00a0")
}

func encodingName(enc pb.Encoding) string {
	if enc == pb.Encoding_JSON {
		return "JSON"
	}
	return "binary"
}

// protoCompatible checks next against prev field by field number, and
// recursively through message-typed fields. seen breaks cycles of
// recursive messages.
func protoCompatible(prev, next protoreflect.MessageDescriptor, seen map[[2]protoreflect.FullName]bool) error {
	pair := [2]protoreflect.FullName{prev.FullName(), next.FullName()}
	if seen[pair] {
		return nil
	}
	seen[pair] = true
	pf, nf := prev.Fields(), next.Fields()
	for i := range pf.Len() {
		p := pf.Get(i)
		n := nf.ByNumber(p.Number())
		if n == nil {
			if p.Cardinality() != protoreflect.Optional {
				return fmt.Errorf("field %s (number %d) is %s and cannot be removed: only optional fields can", p.FullName(), p.Number(), p.Cardinality())
			}
			continue
		}
		if err := protoSameField(p, n); err != nil {
			return err
		}
		if p.Message() != nil && !p.IsMap() {
			if err := protoCompatible(p.Message(), n.Message(), seen); err != nil {
				return err
			}
		}
	}
	for i := range nf.Len() {
		n := nf.Get(i)
		if pf.ByNumber(n.Number()) == nil && n.Cardinality() != protoreflect.Optional {
			return fmt.Errorf("field %s (number %d) is %s and cannot be added: only optional fields can", n.FullName(), n.Number(), n.Cardinality())
		}
	}
	return nil
}

// protoSameField reports an edit of a field kept under the same number.
func protoSameField(p, n protoreflect.FieldDescriptor) error {
	switch {
	case p.Name() != n.Name():
		return fmt.Errorf("field number %d of %s is renamed from %s to %s: existing fields cannot be edited", p.Number(), p.ContainingMessage().FullName(), p.Name(), n.Name())
	case p.Kind() != n.Kind() || p.Cardinality() != n.Cardinality() || p.IsMap() != n.IsMap():
		return fmt.Errorf("field %s (number %d) changes from %s to %s: existing fields cannot be edited", p.FullName(), p.Number(), fieldType(p), fieldType(n))
	case p.Enum() != nil && p.Enum().Name() != n.Enum().Name(),
		p.Message() != nil && p.Message().Name() != n.Message().Name():
		return fmt.Errorf("field %s (number %d) changes from %s to %s: existing fields cannot be edited", p.FullName(), p.Number(), fieldType(p), fieldType(n))
	case p.IsMap() && (p.MapKey().Kind() != n.MapKey().Kind() || p.MapValue().Kind() != n.MapValue().Kind()):
		return fmt.Errorf("field %s (number %d) changes from %s to %s: existing fields cannot be edited", p.FullName(), p.Number(), fieldType(p), fieldType(n))
	}
	return nil
}

func fieldType(f protoreflect.FieldDescriptor) string {
	t := f.Kind().String()
	switch {
	case f.IsMap():
		return fmt.Sprintf("map<%s, %s>", f.MapKey().Kind(), f.MapValue().Kind())
	case f.Message() != nil:
		t = string(f.Message().Name())
	case f.Enum() != nil:
		t = string(f.Enum().Name())
	}
	return f.Cardinality().String() + " " + t
}
