// Package schema validates Pub/Sub schemas, and messages against them, as
// the Pub/Sub service does (https://cloud.google.com/pubsub/docs/schemas):
//
//   - AVRO definitions are Avro 1.11 schemas in JSON; messages are Avro
//     binary (BINARY) or Avro's own JSON encoding (JSON), in which a
//     non-null union value is wrapped as {"type": value}.
//   - PROTOCOL_BUFFER definitions are proto2 or proto3 source defining
//     exactly one top-level type, a message (nested types are fine), with
//     no imports; messages are the protobuf wire format (BINARY) or
//     canonical protobuf JSON (JSON).
//
// A compiled *Schema is immutable and safe for concurrent use, so callers
// cache it by schema name and revision.
package schema

import (
	"fmt"
	"unicode/utf8"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/linkedin/goavro/v2"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// MaxDefinitionSize is the service's limit on a definition: "The schema
// definition field cannot exceed 300 KB in size."
const MaxDefinitionSize = 300 << 10

// Schema is a compiled schema revision. It is immutable and safe for
// concurrent use.
type Schema struct {
	typ pb.Schema_Type

	// AVRO
	codec *goavro.Codec
	avro  *avroType // for Compatible

	// PROTOCOL_BUFFER
	msg protoreflect.MessageDescriptor
}

// ValidateDefinition reports whether definition is a schema of type t the
// service accepts. Errors wrap ErrInvalidSchema.
func ValidateDefinition(t pb.Schema_Type, definition string) error {
	_, err := Compile(t, definition)
	return err
}

// Compile parses and checks definition, a schema of type t. Errors wrap
// ErrInvalidSchema.
func Compile(t pb.Schema_Type, definition string) (*Schema, error) {
	if definition == "" {
		return nil, fmt.Errorf("%w: the definition is empty", ErrInvalidSchema)
	}
	if len(definition) > MaxDefinitionSize {
		return nil, fmt.Errorf("%w: the definition is %d bytes, over the limit of %d", ErrInvalidSchema, len(definition), MaxDefinitionSize)
	}
	if !utf8.ValidString(definition) {
		return nil, fmt.Errorf("%w: the definition is not valid UTF-8", ErrInvalidSchema)
	}
	switch t {
	case pb.Schema_AVRO:
		return compileAvro(definition)
	case pb.Schema_PROTOCOL_BUFFER:
		return compileProto(definition)
	default:
		return nil, fmt.Errorf("%w: the schema type must be AVRO or PROTOCOL_BUFFER, not %v", ErrInvalidSchema, t)
	}
}

// CompileDescriptorSet compiles a PROTOCOL_BUFFER schema given as a
// pre-compiled FileDescriptorSet (google.protobuf.FileDescriptorSet, wire
// format) and the full name of its root message, the service's
// CompiledProtoSchema configuration. The set must hold every file it
// imports. Errors wrap ErrInvalidSchema.
func CompileDescriptorSet(compiled []byte, rootMessage string) (*Schema, error) {
	return compileDescriptorSet(compiled, rootMessage)
}

// Type is the schema's type.
func (s *Schema) Type() pb.Schema_Type { return s.typ }

// Validate reports whether data is a valid message of the schema in
// encoding enc. Errors wrap ErrInvalidMessage and say why in the words of
// the decoder.
func (s *Schema) Validate(enc pb.Encoding, data []byte) error {
	if enc != pb.Encoding_JSON && enc != pb.Encoding_BINARY {
		return fmt.Errorf("%w: the encoding must be JSON or BINARY, not %v", ErrInvalidMessage, enc)
	}
	if s.typ == pb.Schema_AVRO {
		return s.validateAvro(enc, data)
	}
	return s.validateProto(enc, data)
}

// Compatible reports whether next may be committed as a new revision of a
// schema whose current revision is prev, by the service's rules
// (https://cloud.google.com/pubsub/docs/commit-schema-revision): the same
// type; for Protocol Buffer, fields may only be added or removed if they
// are optional, and no field may change its name, type or label; for Avro,
// each must be able to read data written with the other (Avro schema
// resolution, applied both ways). Errors wrap ErrIncompatible.
func Compatible(prev, next *Schema) error {
	if prev.typ != next.typ {
		return fmt.Errorf("%w: the type %v cannot change to %v", ErrIncompatible, prev.typ, next.typ)
	}
	if prev.typ == pb.Schema_AVRO {
		if err := avroCanRead(next.avro, prev.avro); err != nil {
			return fmt.Errorf("%w: the new revision cannot read data of the previous one: %v", ErrIncompatible, err)
		}
		if err := avroCanRead(prev.avro, next.avro); err != nil {
			return fmt.Errorf("%w: the previous revision cannot read data of the new one: %v", ErrIncompatible, err)
		}
		return nil
	}
	if err := protoCompatible(prev.msg, next.msg, map[[2]protoreflect.FullName]bool{}); err != nil {
		return fmt.Errorf("%w: %v", ErrIncompatible, err)
	}
	return nil
}
