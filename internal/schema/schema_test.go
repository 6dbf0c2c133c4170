package schema

import (
	"errors"
	"strings"
	"testing"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/linkedin/goavro/v2"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// The schemas of Google's Pub/Sub samples (us-states.avsc, us-states.proto).
const (
	statesAvro = `{
  "type":"record", "name":"State", "namespace":"utilities",
  "doc":"A list of states in the United States of America.",
  "fields":[
    {"name":"name", "type":"string", "doc":"The common name of the state."},
    {"name":"post_abbr", "type":"string", "doc":"The postal code abbreviation of the state."}
  ]
}`
	statesProto = `syntax = "proto3";
package utilities;
option java_outer_classname = "StateProto";
message State {
  string name = 1;
  string post_abbr = 2;
}`
)

func TestValidateDefinition(t *testing.T) {
	tests := []struct {
		name    string
		typ     pb.Schema_Type
		def     string
		wantErr string // "" for valid; else a substring of the error
	}{
		{"avro record", pb.Schema_AVRO, statesAvro, ""},
		{"avro primitive", pb.Schema_AVRO, `"string"`, ""},
		{"avro recursive record", pb.Schema_AVRO,
			`{"type":"record","name":"Node","fields":[{"name":"next","type":["null","Node"],"default":null}]}`, ""},
		{"avro nested named types", pb.Schema_AVRO, `{"type":"record","name":"R","namespace":"a.b","fields":[
			{"name":"e","type":{"type":"enum","name":"E","symbols":["X","Y"]}},
			{"name":"f","type":{"type":"fixed","name":"F","size":4}},
			{"name":"again","type":"E"},
			{"name":"m","type":{"type":"map","values":{"type":"array","items":"a.b.F"}}},
			{"name":"ts","type":{"type":"long","logicalType":"timestamp-millis"}}]}`, ""},
		{"avro trailing comma", pb.Schema_AVRO, `{"type":"record","name":"invalid","fields":[],}`, "not an Avro schema"},
		{"avro unknown type", pb.Schema_AVRO, `{"type":"record","name":"R","fields":[{"name":"a","type":"Nope"}]}`, "not an Avro schema"},
		{"avro not json", pb.Schema_AVRO, `syntax = "proto3";`, "not an Avro schema"},
		{"proto3", pb.Schema_PROTOCOL_BUFFER, statesProto, ""},
		{"proto2 with required", pb.Schema_PROTOCOL_BUFFER, `syntax = "proto2"; message M { required string a = 1; optional int32 b = 2; }`, ""},
		{"proto nested types", pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3";
			message Order {
			  enum Kind { KIND_UNSPECIFIED = 0; BUY = 1; }
			  message Line { string sku = 1; int64 qty = 2; }
			  Kind kind = 1;
			  repeated Line lines = 2;
			  map<string, Line> by_sku = 3;
			  optional string note = 4;
			}`, ""},
		{"proto two messages", pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3"; message A { string a = 1; } message B { string b = 1; }`, "exactly one top-level type"},
		{"proto top-level enum", pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3"; enum E { E0 = 0; } message A { E e = 1; }`, "exactly one top-level type"},
		{"proto no message", pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3";`, "exactly one top-level type"},
		{"proto import", pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3"; import "google/protobuf/timestamp.proto";
			message A { google.protobuf.Timestamp t = 1; }`, "imports are not supported"},
		{"proto syntax error", pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3"; message A { string a = ; }`, "invalid schema"},
		{"proto unknown type", pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3"; message A { Nope a = 1; }`, "invalid schema"},
		{"proto editions", pb.Schema_PROTOCOL_BUFFER, `edition = "2023"; message A { string a = 1; }`, "proto2 and proto3"},
		{"empty", pb.Schema_AVRO, "", "empty"},
		{"too big", pb.Schema_AVRO, `"string"` + strings.Repeat(" ", MaxDefinitionSize), "over the limit"},
		{"unspecified type", pb.Schema_TYPE_UNSPECIFIED, statesAvro, "AVRO or PROTOCOL_BUFFER"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateDefinition(tt.typ, tt.def)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("ValidateDefinition = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidSchema) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ValidateDefinition = %v, want ErrInvalidSchema with %q", err, tt.wantErr)
			}
		})
	}
}

func TestValidateMessage(t *testing.T) {
	avro := mustCompile(t, pb.Schema_AVRO, statesAvro)
	codec, err := goavro.NewCodec(statesAvro)
	if err != nil {
		t.Fatal(err)
	}
	avroBin, err := codec.BinaryFromNative(nil, map[string]any{"name": "Alaska", "post_abbr": "AK"})
	if err != nil {
		t.Fatal(err)
	}
	unionAvro := mustCompile(t, pb.Schema_AVRO, `{"type":"record","name":"U","fields":[{"name":"v","type":["null","string","int"]}]}`)

	proto3 := mustCompile(t, pb.Schema_PROTOCOL_BUFFER, statesProto)
	md := proto3.msg
	m := dynamicpb.NewMessage(md)
	m.Set(md.Fields().ByName("name"), protoString("Alaska"))
	m.Set(md.Fields().ByName("post_abbr"), protoString("AK"))
	protoBin, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	proto2 := mustCompile(t, pb.Schema_PROTOCOL_BUFFER, `syntax = "proto2"; message M { required string a = 1; }`)

	tests := []struct {
		name   string
		schema *Schema
		enc    pb.Encoding
		data   string
		valid  bool
	}{
		{"avro json", avro, pb.Encoding_JSON, `{"name":"Alaska","post_abbr":"AK"}`, true},
		{"avro json whitespace", avro, pb.Encoding_JSON, " {\"name\":\"Alaska\", \"post_abbr\":\"AK\"}\n", true},
		{"avro json wrong type", avro, pb.Encoding_JSON, `{"name":"Alaska","post_abbr":7}`, false},
		{"avro json missing field", avro, pb.Encoding_JSON, `{"name":"Alaska"}`, false},
		{"avro json trailing data", avro, pb.Encoding_JSON, `{"name":"Alaska","post_abbr":"AK"} {}`, false},
		{"avro json not json", avro, pb.Encoding_JSON, `Alaska`, false},
		{"avro json union wrapped", unionAvro, pb.Encoding_JSON, `{"v":{"string":"x"}}`, true},
		{"avro json union null", unionAvro, pb.Encoding_JSON, `{"v":null}`, true},
		{"avro json union unwrapped", unionAvro, pb.Encoding_JSON, `{"v":"x"}`, false},
		{"avro binary", avro, pb.Encoding_BINARY, string(avroBin), true},
		{"avro binary truncated", avro, pb.Encoding_BINARY, string(avroBin[:len(avroBin)-1]), false},
		{"avro binary too much data", avro, pb.Encoding_BINARY, string(avroBin) + "x", false},
		{"avro binary empty", avro, pb.Encoding_BINARY, "", false},
		{"proto json", proto3, pb.Encoding_JSON, `{"name":"Alaska","post_abbr":"AK"}`, true},
		{"proto json camel case", proto3, pb.Encoding_JSON, `{"name":"Alaska","postAbbr":"AK"}`, true},
		{"proto json empty object", proto3, pb.Encoding_JSON, `{}`, true},
		{"proto json unknown field", proto3, pb.Encoding_JSON, `{"name":"Alaska","capital":"Juneau"}`, false},
		{"proto json wrong type", proto3, pb.Encoding_JSON, `{"name":7}`, false},
		{"proto binary", proto3, pb.Encoding_BINARY, string(protoBin), true},
		{"proto binary empty", proto3, pb.Encoding_BINARY, "", true},
		{"proto binary garbage", proto3, pb.Encoding_BINARY, "\xff\xff\xff", false},
		{"proto binary truncated", proto3, pb.Encoding_BINARY, "\x0a\x05ab", false},  // field 1, 5 bytes long, but 2 follow
		{"proto binary bad utf8", proto3, pb.Encoding_BINARY, "\x0a\x01\xff", false}, // proto3 strings must be UTF-8
		{"proto2 required missing", proto2, pb.Encoding_BINARY, "", false},
		{"proto2 required json missing", proto2, pb.Encoding_JSON, `{}`, false},
		{"encoding unspecified", avro, pb.Encoding_ENCODING_UNSPECIFIED, `{"name":"Alaska","post_abbr":"AK"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.schema.Validate(tt.enc, []byte(tt.data))
			if tt.valid && err != nil {
				t.Fatalf("Validate = %v, want nil", err)
			}
			if !tt.valid && !errors.Is(err, ErrInvalidMessage) {
				t.Fatalf("Validate = %v, want ErrInvalidMessage", err)
			}
		})
	}
}

func TestCompileDescriptorSet(t *testing.T) {
	// A set with an import, which a definition may not have.
	ts := protodesc.ToFileDescriptorProto(timestamppb.File_google_protobuf_timestamp_proto)
	file := &descriptorpb.FileDescriptorProto{
		Name:       proto.String("event.proto"),
		Package:    proto.String("acme"),
		Syntax:     proto.String("proto3"),
		Dependency: []string{"google/protobuf/timestamp.proto"},
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("Event"),
			Field: []*descriptorpb.FieldDescriptorProto{{
				Name: proto.String("at"), JsonName: proto.String("at"), Number: proto.Int32(1),
				Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(),
				Type:  descriptorpb.FieldDescriptorProto_TYPE_MESSAGE.Enum(), TypeName: proto.String(".google.protobuf.Timestamp"),
			}},
		}},
	}
	set, err := proto.Marshal(&descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{ts, file}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := CompileDescriptorSet(set, "acme.Event")
	if err != nil {
		t.Fatalf("CompileDescriptorSet = %v", err)
	}
	if err := s.Validate(pb.Encoding_JSON, []byte(`{"at":"2024-01-02T03:04:05Z"}`)); err != nil {
		t.Errorf("Validate(valid) = %v", err)
	}
	if err := s.Validate(pb.Encoding_JSON, []byte(`{"at":"yesterday"}`)); !errors.Is(err, ErrInvalidMessage) {
		t.Errorf("Validate(invalid) = %v, want ErrInvalidMessage", err)
	}
	for _, root := range []string{"acme.Nope", "acme"} {
		if _, err := CompileDescriptorSet(set, root); !errors.Is(err, ErrInvalidSchema) {
			t.Errorf("CompileDescriptorSet(%q) = %v, want ErrInvalidSchema", root, err)
		}
	}
	if _, err := CompileDescriptorSet([]byte("\xff"), "acme.Event"); !errors.Is(err, ErrInvalidSchema) {
		t.Errorf("CompileDescriptorSet(garbage) = %v, want ErrInvalidSchema", err)
	}
}

func TestCompatible(t *testing.T) {
	tests := []struct {
		name       string
		typ        pb.Schema_Type
		prev, next string
		ok         bool
	}{
		// Google's samples commit us-states-plus.proto (a new int64 field)
		// over us-states.proto.
		{"proto add field", pb.Schema_PROTOCOL_BUFFER, statesProto,
			strings.Replace(statesProto, "}", "  int64 population = 3;\n}", 1), true},
		{"proto remove field", pb.Schema_PROTOCOL_BUFFER, statesProto,
			`syntax = "proto3"; package utilities; message State { string name = 1; }`, true},
		{"proto add optional keyword field", pb.Schema_PROTOCOL_BUFFER, statesProto,
			strings.Replace(statesProto, "}", "  optional bool big = 4;\n}", 1), true},
		{"proto add repeated field", pb.Schema_PROTOCOL_BUFFER, statesProto,
			strings.Replace(statesProto, "}", "  repeated string cities = 3;\n}", 1), false},
		{"proto add required field", pb.Schema_PROTOCOL_BUFFER, `syntax = "proto2"; message M { optional string a = 1; }`,
			`syntax = "proto2"; message M { optional string a = 1; required string b = 2; }`, false},
		{"proto remove repeated field", pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3"; message M { string a = 1; repeated string b = 2; }`,
			`syntax = "proto3"; message M { string a = 1; }`, false},
		{"proto rename field", pb.Schema_PROTOCOL_BUFFER, statesProto, strings.Replace(statesProto, "post_abbr", "abbr", 1), false},
		{"proto change type", pb.Schema_PROTOCOL_BUFFER, statesProto, strings.Replace(statesProto, "string post_abbr", "bytes post_abbr", 1), false},
		{"proto nested change", pb.Schema_PROTOCOL_BUFFER,
			`syntax = "proto3"; message M { message N { string a = 1; } N n = 1; }`,
			`syntax = "proto3"; message M { message N { int32 a = 1; } N n = 1; }`, false},
		{"proto nested add", pb.Schema_PROTOCOL_BUFFER,
			`syntax = "proto3"; message M { message N { string a = 1; } N n = 1; }`,
			`syntax = "proto3"; message M { message N { string a = 1; string b = 2; } N n = 1; }`, true},
		{"avro add field with default", pb.Schema_AVRO, statesAvro,
			strings.Replace(statesAvro, `"doc":"The postal code abbreviation of the state."}`,
				`"doc":"The postal code abbreviation of the state."}, {"name":"population","type":"long","default":0}`, 1), true},
		{"avro add field without default", pb.Schema_AVRO, statesAvro,
			strings.Replace(statesAvro, `"doc":"The postal code abbreviation of the state."}`,
				`"doc":"The postal code abbreviation of the state."}, {"name":"population","type":"long"}`, 1), false},
		{"avro remove field without default", pb.Schema_AVRO, statesAvro,
			`{"type":"record","name":"State","namespace":"utilities","fields":[{"name":"name","type":"string"}]}`, false},
		{"avro remove field with default", pb.Schema_AVRO,
			`{"type":"record","name":"R","fields":[{"name":"a","type":"string"},{"name":"b","type":"int","default":1}]}`,
			`{"type":"record","name":"R","fields":[{"name":"a","type":"string"}]}`, true},
		{"avro widen type one way", pb.Schema_AVRO,
			`{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}`,
			`{"type":"record","name":"R","fields":[{"name":"a","type":"long"}]}`, false},
		{"avro string to bytes", pb.Schema_AVRO,
			`{"type":"record","name":"R","fields":[{"name":"a","type":"string"}]}`,
			`{"type":"record","name":"R","fields":[{"name":"a","type":"bytes"}]}`, true},
		{"avro rename record", pb.Schema_AVRO,
			`{"type":"record","name":"R","fields":[]}`, `{"type":"record","name":"S","fields":[]}`, false},
		{"avro add enum symbol", pb.Schema_AVRO, `{"type":"enum","name":"E","symbols":["A"]}`, `{"type":"enum","name":"E","symbols":["A","B"]}`, false},
		{"avro add enum symbol with defaults", pb.Schema_AVRO, `{"type":"enum","name":"E","symbols":["A"],"default":"A"}`,
			`{"type":"enum","name":"E","symbols":["A","B"],"default":"A"}`, true},
		{"avro union grows", pb.Schema_AVRO, `["null","string"]`, `["null","string","int"]`, false},
		{"avro recursive", pb.Schema_AVRO,
			`{"type":"record","name":"Node","fields":[{"name":"next","type":["null","Node"],"default":null}]}`,
			`{"type":"record","name":"Node","fields":[{"name":"next","type":["null","Node"],"default":null},{"name":"v","type":"int","default":0}]}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Compatible(mustCompile(t, tt.typ, tt.prev), mustCompile(t, tt.typ, tt.next))
			if tt.ok && err != nil {
				t.Fatalf("Compatible = %v, want nil", err)
			}
			if !tt.ok && !errors.Is(err, ErrIncompatible) {
				t.Fatalf("Compatible = %v, want ErrIncompatible", err)
			}
		})
	}
	if err := Compatible(mustCompile(t, pb.Schema_AVRO, statesAvro), mustCompile(t, pb.Schema_PROTOCOL_BUFFER, statesProto)); !errors.Is(err, ErrIncompatible) {
		t.Errorf("Compatible(avro, proto) = %v, want ErrIncompatible", err)
	}
}

func mustCompile(t *testing.T, typ pb.Schema_Type, def string) *Schema {
	t.Helper()
	s, err := Compile(typ, def)
	if err != nil {
		t.Fatalf("Compile(%v): %v", typ, err)
	}
	return s
}

func protoString(s string) protoreflect.Value { return protoreflect.ValueOfString(s) }
