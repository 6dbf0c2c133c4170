package schemaapi

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetorder/jetorder/internal/testutil"
)

const (
	testSchemaProto = `syntax = "proto3";
package utilities;
message State {
  string name = 1;
  string post_abbr = 2;
}`
	testProject = "schema-project"
)

// withField is testSchemaProto with one more field.
func withField(def, field string) string {
	return strings.Replace(def, "}", "  "+field+"\n}", 1)
}

func newTestServer(t *testing.T) (*Server, func() *Server) {
	t.Helper()
	srv := testutil.Server(t)
	another := func() *Server { return New(testutil.Connect(t, srv.ClientURL()), 1, nil) }
	return another(), another
}

func wantStatus(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: %v (%v), want %v", what, got, err, want)
	}
}

// CheckSettings refuses the schema settings the service refuses.
func TestSchemaCheckSettings(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestServer(t)
	name := "projects/" + testProject + "/schemas/states"
	r1, err := s.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + testProject, SchemaId: "states",
		Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: testSchemaProto}})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := s.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: name,
		Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: withField(testSchemaProto, "int64 population = 3;")}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		settings *pb.SchemaSettings
		want     codes.Code
	}{
		{"none", nil, codes.OK},
		{"schema", &pb.SchemaSettings{Schema: name, Encoding: pb.Encoding_JSON}, codes.OK},
		{"range", &pb.SchemaSettings{Schema: name, Encoding: pb.Encoding_BINARY, FirstRevisionId: r1.RevisionId, LastRevisionId: r2.RevisionId}, codes.OK},
		{"one revision", &pb.SchemaSettings{Schema: name, Encoding: pb.Encoding_BINARY, FirstRevisionId: r2.RevisionId, LastRevisionId: r2.RevisionId}, codes.OK},
		{"no schema", &pb.SchemaSettings{Encoding: pb.Encoding_JSON}, codes.InvalidArgument},
		{"bad name", &pb.SchemaSettings{Schema: "states", Encoding: pb.Encoding_JSON}, codes.InvalidArgument},
		{"name with revision", &pb.SchemaSettings{Schema: name + "@" + r1.RevisionId, Encoding: pb.Encoding_JSON}, codes.InvalidArgument},
		{"deleted schema", &pb.SchemaSettings{Schema: DeletedSchema, Encoding: pb.Encoding_JSON}, codes.InvalidArgument},
		{"no encoding", &pb.SchemaSettings{Schema: name}, codes.InvalidArgument},
		{"missing schema", &pb.SchemaSettings{Schema: name + "-nope", Encoding: pb.Encoding_JSON}, codes.NotFound},
		{"missing first", &pb.SchemaSettings{Schema: name, Encoding: pb.Encoding_JSON, FirstRevisionId: "0000beef"}, codes.NotFound},
		{"missing last", &pb.SchemaSettings{Schema: name, Encoding: pb.Encoding_JSON, LastRevisionId: "0000beef"}, codes.NotFound},
		{"first after last", &pb.SchemaSettings{Schema: name, Encoding: pb.Encoding_JSON, FirstRevisionId: r2.RevisionId, LastRevisionId: r1.RevisionId}, codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts, err := s.CheckSettings(ctx, tt.settings)
			wantStatus(t, "CheckSettings", err, tt.want)
			if err == nil && tt.settings != nil && (ts.Schema != name || ts.Encoding != tt.settings.Encoding.String() ||
				ts.FirstRevisionID != tt.settings.FirstRevisionId || ts.LastRevisionID != tt.settings.LastRevisionId || ts.SchemaUID == "") {
				t.Fatalf("CheckSettings = %+v", ts)
			}
			if err == nil && tt.settings == nil && ts != nil {
				t.Fatalf("CheckSettings(nil) = %+v", ts)
			}
		})
	}
}

// ValidateForTopic accepts a message valid against any revision in the
// topic's range, keeps the range when its bounds are deleted, and refuses
// everything once the schema is deleted.
func TestSchemaValidateForTopic(t *testing.T) {
	ctx := context.Background()
	s, another := newTestServer(t)
	name := "projects/" + testProject + "/schemas/states"
	commit := func(def string) string {
		t.Helper()
		r, err := s.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: name, Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: def}})
		if err != nil {
			t.Fatalf("CommitSchema: %v", err)
		}
		return r.RevisionId
	}
	r1, err := s.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + testProject, SchemaId: "states",
		Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: testSchemaProto}})
	if err != nil {
		t.Fatal(err)
	}
	withPop := withField(testSchemaProto, "int64 population = 3;")
	r2 := commit(withPop)
	r3 := commit(withField(withPop, "bool big = 4;"))

	const (
		plain = `{"name":"Alaska","post_abbr":"AK"}`
		pop   = `{"name":"Alaska","population":"733391"}` // valid from r2
		big   = `{"name":"Alaska","big":true}`            // valid in r3 only
	)
	bound, err := s.CheckSettings(ctx, &pb.SchemaSettings{Schema: name, Encoding: pb.Encoding_JSON})
	if err != nil {
		t.Fatal(err)
	}
	// settings are bound's with another range, which may name revisions
	// deleted since (CheckSettings would refuse those).
	settings := func(first, last string) *TopicSchema {
		ts := *bound
		ts.FirstRevisionID, ts.LastRevisionID = first, last
		return &ts
	}
	check := func(what string, ts *TopicSchema, data string, want codes.Code) {
		t.Helper()
		_, err := s.ValidateForTopic(ctx, ts, []byte(data))
		wantStatus(t, what, err, want)
	}
	check("no settings", nil, "anything", codes.OK)
	check("plain, all revisions", settings("", ""), plain, codes.OK)
	check("pop, all revisions", settings("", ""), pop, codes.OK)
	check("big, all revisions", settings("", ""), big, codes.OK)
	check("pop, up to r1", settings("", r1.RevisionId), pop, codes.InvalidArgument)
	check("plain, up to r1", settings("", r1.RevisionId), plain, codes.OK)
	check("pop, from r2", settings(r2, ""), pop, codes.OK)
	check("big, r1 to r2", settings(r1.RevisionId, r2), big, codes.InvalidArgument)
	check("not json", settings("", ""), "Alaska", codes.InvalidArgument)

	// The revision a message is valid against: the newest that accepts it.
	for _, tt := range []struct {
		what string
		ts   *TopicSchema
		data string
		want string
	}{
		{"plain, all revisions", settings("", ""), plain, r3},
		{"plain, up to r2", settings("", r2), plain, r2},
		{"plain, only r1", settings(r1.RevisionId, r1.RevisionId), plain, r1.RevisionId},
	} {
		if rev, err := s.ValidateForTopic(ctx, tt.ts, []byte(tt.data)); err != nil || rev != tt.want {
			t.Errorf("ValidateForTopic(%s) = %q, %v; want %q", tt.what, rev, err, tt.want)
		}
	}

	// Publish validates concurrently, through the caches.
	errs := make(chan error, 8*50)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				_, err := s.ValidateForTopic(ctx, settings(r2, ""), []byte(pop))
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		wantStatus(t, "concurrent ValidateForTopic", err, codes.OK)
	}

	// The service's answer, followed by why: a status, and an ErrorInfo.
	_, err = s.ValidateForTopic(ctx, settings("", r1.RevisionId), []byte(pop))
	st := status.Convert(err)
	if msg := st.Message(); !strings.HasPrefix(msg, "Invalid data in message: Message failed schema validation. ") ||
		!strings.Contains(msg, "revision "+r1.RevisionId) || !strings.Contains(msg, "population") {
		t.Errorf("message = %q", msg)
	}
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if info == nil || info.Reason != "INVALID_JSON_PROTO_MESSAGE" || info.Domain != "pubsub.googleapis.com" ||
		!strings.Contains(info.Metadata["revisionInfo"], "revision_id="+r1.RevisionId) {
		t.Errorf("ErrorInfo = %v", info)
	}

	// Deleting r3, the range's last bound, keeps the range up to where r3
	// was: r2 still validates, r3's fields no longer do, and r4 is after it.
	if _, err := s.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: name + "@" + r3}); err != nil {
		t.Fatal(err)
	}
	r4 := commit(withField(withPop, "bool big = 4;"))
	check("pop, r2 to deleted r3", settings(r2, r3), pop, codes.OK)
	check("big, r2 to deleted r3", settings(r2, r3), big, codes.InvalidArgument)
	check("big, from deleted r3", settings(r3, ""), big, codes.OK) // r4
	if _, err := s.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: name + "@" + r2}); err != nil {
		t.Fatal(err)
	}
	check("plain, range emptied", settings(r2, r3), plain, codes.InvalidArgument)
	check("plain, from r4", settings(r4, r4), plain, codes.OK)

	// Another sidecar, sharing the bucket, caches the record too...
	s2 := another()
	check2 := func() error {
		_, err := s2.ValidateForTopic(ctx, settings("", ""), []byte(plain))
		return err
	}
	wantStatus(t, "other server", check2(), codes.OK)

	// ...and sees the schema deleted within recordTTL; this one at once.
	if _, err := s.DeleteSchema(ctx, &pb.DeleteSchemaRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	check("deleted schema", settings("", ""), plain, codes.NotFound)
	check("deleted-schema marker", &TopicSchema{Schema: DeletedSchema, Encoding: "JSON"}, plain, codes.NotFound)
	testutil.Eventually(t, 5*recordTTL+time.Second, func() bool {
		return status.Code(check2()) == codes.NotFound
	}, "the other server still accepts messages of the deleted schema")
	if got, err := s.SettingsOf(ctx, settings("", "")); err != nil || got.Schema != DeletedSchema || got.Encoding != pb.Encoding_JSON {
		t.Fatalf("SettingsOf(deleted) = %v, %v", got, err)
	}

	// A schema created again under the name is another one: the topic's
	// schema stays deleted.
	if _, err := s.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + testProject, SchemaId: "states",
		Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: testSchemaProto}}); err != nil {
		t.Fatal(err)
	}
	check("schema created again", settings("", ""), plain, codes.NotFound)
	if got, err := s.SettingsOf(ctx, settings("", "")); err != nil || got.Schema != DeletedSchema {
		t.Fatalf("SettingsOf(created again) = %v, %v", got, err)
	}
	again, err := s.CheckSettings(ctx, &pb.SchemaSettings{Schema: name, Encoding: pb.Encoding_JSON})
	if err != nil || again.SchemaUID == bound.SchemaUID {
		t.Fatalf("CheckSettings(created again) = %+v, %v; the first had uid %s", again, err, bound.SchemaUID)
	}
	if got, err := s.SettingsOf(ctx, again); err != nil || got.Schema != name {
		t.Fatalf("SettingsOf(bound again) = %v, %v", got, err)
	}
	check("bound again", again, plain, codes.OK)
}

// A project without schemas lists none; one with lists only its own.
func TestSchemaListProjects(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestServer(t)
	for _, p := range []string{"proj-a", "proj-a.b"} {
		if _, err := s.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + p, SchemaId: "states",
			Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: testSchemaProto}}); err != nil {
			t.Fatal(err)
		}
	}
	for p, want := range map[string]int{"empty": 0, "proj-a": 1, "proj-a.b": 1} {
		resp, err := s.ListSchemas(ctx, &pb.ListSchemasRequest{Parent: "projects/" + p})
		if err != nil || len(resp.Schemas) != want || want == 1 && resp.Schemas[0].Name != "projects/"+p+"/schemas/states" {
			t.Errorf("ListSchemas(%s) = %v, %v; want %d", p, resp, err, want)
		}
	}
}

func TestSchemaKeyEscaping(t *testing.T) {
	for _, s := range []string{"plain-id_1", "s.b~+%", "a:b", "=41", ""} {
		k := escapeKey(s)
		if strings.ContainsAny(k, ".*> ") || unescapeKey(k) != s {
			t.Errorf("escapeKey(%q) = %q, back %q", s, k, unescapeKey(k))
		}
	}
}

// A schema given as a compiled FileDescriptorSet and root message.
func TestSchemaCompiledProto(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestServer(t)
	set, err := proto.Marshal(&descriptorpb.FileDescriptorSet{File: []*descriptorpb.FileDescriptorProto{
		protodesc.ToFileDescriptorProto(timestamppb.File_google_protobuf_timestamp_proto),
	}})
	if err != nil {
		t.Fatal(err)
	}
	compiled := &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Configuration: &pb.Schema_CompiledProtoSchema{
		CompiledProtoSchema: &pb.CompiledProtoSchema{RootMessage: "google.protobuf.Timestamp", CompiledBytes: set},
	}}
	created, err := s.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + testProject, SchemaId: "stamp", Schema: compiled})
	if err != nil {
		t.Fatalf("CreateSchema: %v", err)
	}
	got, err := s.GetSchema(ctx, &pb.GetSchemaRequest{Name: created.Name})
	if err != nil || got.GetCompiledProtoSchema().GetRootMessage() != "google.protobuf.Timestamp" || got.Definition != "" {
		t.Fatalf("GetSchema = %v, %v", got, err)
	}
	validate := func(msg string) error {
		_, err := s.ValidateMessage(ctx, &pb.ValidateMessageRequest{Parent: "projects/" + testProject,
			SchemaSpec: &pb.ValidateMessageRequest_Name{Name: created.Name}, Encoding: pb.Encoding_JSON, Message: []byte(msg)})
		return err
	}
	wantStatus(t, "valid", validate(`"2024-01-02T03:04:05Z"`), codes.OK)
	wantStatus(t, "invalid", validate(`"yesterday"`), codes.InvalidArgument)

	both := proto.Clone(compiled).(*pb.Schema)
	both.Definition = testSchemaProto
	_, err = s.ValidateSchema(ctx, &pb.ValidateSchemaRequest{Parent: "projects/" + testProject, Schema: both})
	wantStatus(t, "definition and compiled", err, codes.InvalidArgument)
	avro := proto.Clone(compiled).(*pb.Schema)
	avro.Type = pb.Schema_AVRO
	_, err = s.ValidateSchema(ctx, &pb.ValidateSchemaRequest{Parent: "projects/" + testProject, Schema: avro})
	wantStatus(t, "compiled avro", err, codes.InvalidArgument)
}
