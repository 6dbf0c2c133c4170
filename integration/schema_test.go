package integration

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/linkedin/goavro/v2"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/jetorder/jetorder/internal/itest"
	"github.com/jetorder/jetorder/internal/sidecar"
)

// The schemas of Google's Pub/Sub samples (us-states.avsc, us-states.proto)
// and the revisions the samples commit over them (us-states-plus: one more
// field).
const (
	schemaAvro = `{"type":"record","name":"State","namespace":"utilities","fields":[
  {"name":"name","type":"string"},
  {"name":"post_abbr","type":"string"}]}`
	schemaAvroPlus = `{"type":"record","name":"State","namespace":"utilities","fields":[
  {"name":"name","type":"string"},
  {"name":"post_abbr","type":"string"},
  {"name":"population","type":"long","default":0}]}`
	schemaProto = `syntax = "proto3";
package utilities;
message State {
  string name = 1;
  string post_abbr = 2;
}`
	// Field 1 "Alaska", field 2 "AK".
	schemaProtoBinary = "\x0a\x06Alaska\x12\x02AK"
)

var revisionIDPattern = regexp.MustCompile(`^[0-9a-f]{8}$`)

// schemaBackend is a server of the SchemaService: Google's fake, Google's
// emulator, or the sidecar.
type schemaBackend struct {
	name string
	// service: it answers as the service does where the tests assert it
	// (the sidecar; Google's emulator, for Avro: it has no Protocol
	// Buffer schemas, noProto). pstest checks nothing.
	service  bool
	emulator bool
	start    func(t *testing.T) schemaServer
}

// emulatorProto says whether err answers a request about a Protocol
// Buffer schema (of type typ) on Google's emulator, which answers
// UNIMPLEMENTED, as asserted here.
func (b schemaBackend) emulatorProto(t *testing.T, what string, typ pb.Schema_Type, err error) bool {
	t.Helper()
	if !b.emulator || typ != pb.Schema_PROTOCOL_BUFFER {
		return false
	}
	wantCode(t, "the emulator's "+what, err, codes.Unimplemented)
	return true
}

// noProto skips the rest of a test of Protocol Buffer schemas on Google's
// emulator, which has none: it answers UNIMPLEMENTED, as asserted here.
func (b schemaBackend) noProto(t *testing.T, c *vkit.SchemaClient, parent string) {
	t.Helper()
	if !b.emulator {
		return
	}
	_, err := c.CreateSchema(context.Background(), &pb.CreateSchemaRequest{Parent: parent, SchemaId: "proto",
		Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: schemaProto}})
	wantCode(t, "the emulator's Protocol Buffer schema", err, codes.Unimplemented)
	t.Skip("Google's emulator has no Protocol Buffer schemas (UNIMPLEMENTED)")
}

// schemaServer is a started backend: its address and the project a test
// uses there.
type schemaServer struct{ addr, project string }

func (s schemaServer) parent() string          { return "projects/" + s.project }
func (s schemaServer) schema(id string) string { return s.parent() + "/schemas/" + id }
func (s schemaServer) topic(id string) string  { return s.parent() + "/topics/" + id }
func (s schemaServer) sub(id string) string    { return s.parent() + "/subscriptions/" + id }

var schemaBackends = []schemaBackend{
	{name: "pstest", start: func(t *testing.T) schemaServer {
		srv := pstest.NewServer()
		t.Cleanup(func() { _ = srv.Close() })
		return schemaServer{srv.Addr, project}
	}},
	{name: "emulator", service: true, emulator: true, start: func(t *testing.T) schemaServer {
		skipPerKeyPass(t)
		addr, p := itest.Emulator(t)
		return schemaServer{addr, p}
	}},
	{name: "sidecar", service: true, start: func(t *testing.T) schemaServer {
		return schemaServer{itest.Start(t, sidecar.Config{}).GRPC, project}
	}},
}

// schemaClients are Google's schema admin client and a bare gRPC client
// (for page tokens, which the admin client's iterators hide) of addr.
func schemaClients(t *testing.T, addr string) (*vkit.SchemaClient, pb.SchemaServiceClient) {
	t.Helper()
	sc, err := vkit.NewSchemaClient(context.Background(), itest.ClientOptions(addr)...)
	if err != nil {
		t.Fatalf("NewSchemaClient: %v", err)
	}
	t.Cleanup(func() { _ = sc.Close() })
	return sc, pb.NewSchemaServiceClient(itest.Dial(t, addr))
}

func schemaPath(id string) string { return "projects/" + project + "/schemas/" + id }

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: code %v (%v), want %v", what, got, err, want)
	}
}

func mustCreateSchema(t *testing.T, c *vkit.SchemaClient, parent, id string, typ pb.Schema_Type, def string) *pb.Schema {
	t.Helper()
	s, err := c.CreateSchema(context.Background(), &pb.CreateSchemaRequest{
		Parent: parent, SchemaId: id, Schema: &pb.Schema{Type: typ, Definition: def},
	})
	if err != nil {
		t.Fatalf("CreateSchema(%s): %v", id, err)
	}
	return s
}

func listRevisions(t *testing.T, c *vkit.SchemaClient, name string, view pb.SchemaView) []*pb.Schema {
	t.Helper()
	var out []*pb.Schema
	it := c.ListSchemaRevisions(context.Background(), &pb.ListSchemaRevisionsRequest{Name: name, View: view})
	for {
		s, err := it.Next()
		if err == iterator.Done {
			return out
		}
		if err != nil {
			t.Fatalf("ListSchemaRevisions(%s): %v", name, err)
		}
		out = append(out, s)
	}
}

func revisionIDs(schemas []*pb.Schema) []string {
	var ids []string
	for _, s := range schemas {
		ids = append(ids, s.RevisionId)
	}
	return ids
}

// The schema lifecycle through Google's Go client, against Google's fake and
// against the sidecar. pstest stores what it is given and checks nothing, so
// where the sidecar refuses (or answers) as the service does and pstest does
// not, each side is asserted separately.
func TestSchemaLifecycle(t *testing.T) {
	for _, b := range schemaBackends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			srv := b.start(t)
			c, _ := schemaClients(t, srv.addr)
			name := srv.schema("states")

			first := mustCreateSchema(t, c, srv.parent(), "states", pb.Schema_AVRO, schemaAvro)
			if first.Name != name || first.Type != pb.Schema_AVRO || first.Definition != schemaAvro ||
				!revisionIDPattern.MatchString(first.RevisionId) || first.RevisionCreateTime == nil {
				t.Fatalf("CreateSchema = %v", first)
			}

			// A second schema of the same id: the service answers
			// ALREADY_EXISTS; pstest adds a revision.
			_, err := c.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: srv.parent(), SchemaId: "states",
				Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: schemaAvro}})
			if b.service {
				wantCode(t, "CreateSchema(existing)", err, codes.AlreadyExists)
			} else if err != nil {
				t.Fatalf("pstest CreateSchema(existing): %v", err)
			} else if _, err := c.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: name + "@" + first.RevisionId}); err != nil {
				t.Fatalf("pstest: drop the extra revision: %v", err) // the oldest goes; the copy of it stays the newest
			} else {
				first = listRevisions(t, c, name, pb.SchemaView_FULL)[0]
			}

			got, err := c.GetSchema(ctx, &pb.GetSchemaRequest{Name: name, View: pb.SchemaView_FULL})
			if err != nil || got.Definition != schemaAvro || got.RevisionId != first.RevisionId || got.Name != name {
				t.Fatalf("GetSchema(FULL) = %v, %v", got, err)
			}
			// BASIC omits the definition; pstest ignores the view.
			got, err = c.GetSchema(ctx, &pb.GetSchemaRequest{Name: name, View: pb.SchemaView_BASIC})
			if err != nil || got.Type != pb.Schema_AVRO || got.RevisionId != first.RevisionId {
				t.Fatalf("GetSchema(BASIC) = %v, %v", got, err)
			}
			if b.service && got.Definition != "" {
				t.Fatalf("GetSchema(BASIC) has a definition: %v", got)
			}

			// A compatible revision (Google's us-states-plus).
			second, err := c.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: name, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: schemaAvroPlus}})
			if err != nil || second.Definition != schemaAvroPlus || second.Name != name || !revisionIDPattern.MatchString(second.RevisionId) ||
				second.RevisionId == first.RevisionId {
				t.Fatalf("CommitSchema = %v, %v", second, err)
			}
			if got, err := c.GetSchema(ctx, &pb.GetSchemaRequest{Name: name}); err != nil || got.RevisionId != second.RevisionId {
				t.Fatalf("GetSchema after commit = %v, %v", got, err)
			}

			// An older revision by name@revision. The service answers with
			// the name asked for (AIP-162; Google's .NET sample tests note
			// "the name includes the revision ID"); pstest and Google's
			// emulator with the bare name.
			got, err = c.GetSchema(ctx, &pb.GetSchemaRequest{Name: name + "@" + first.RevisionId, View: pb.SchemaView_FULL})
			if err != nil || got.RevisionId != first.RevisionId || got.Definition != schemaAvro {
				t.Fatalf("GetSchema(@first) = %v, %v", got, err)
			}
			if wantName := map[bool]string{true: name + "@" + first.RevisionId, false: name}[b.service && !b.emulator]; got.Name != wantName {
				t.Fatalf("GetSchema(@first).Name = %q, want %q", got.Name, wantName)
			}
			_, err = c.GetSchema(ctx, &pb.GetSchemaRequest{Name: name + "@0000beef"})
			wantCode(t, "GetSchema(@missing)", err, codes.NotFound)

			// Revisions: the service lists them newest first (AIP-162),
			// named name@revision; pstest and Google's emulator oldest
			// first, with the bare name.
			revs := listRevisions(t, c, name, pb.SchemaView_FULL)
			ids := revisionIDs(revs)
			if b.service && !b.emulator {
				if !slices.Equal(ids, []string{second.RevisionId, first.RevisionId}) || revs[0].Name != name+"@"+second.RevisionId ||
					revs[0].Definition != schemaAvroPlus {
					t.Fatalf("ListSchemaRevisions = %v", revs)
				}
			} else if !slices.Equal(ids, []string{first.RevisionId, second.RevisionId}) {
				t.Fatalf("%s ListSchemaRevisions = %v", b.name, ids)
			}

			// Rollback makes a new revision with the old definition.
			third, err := c.RollbackSchema(ctx, &pb.RollbackSchemaRequest{Name: name, RevisionId: first.RevisionId})
			if err != nil || third.Definition != schemaAvro || third.RevisionId == first.RevisionId || third.RevisionId == second.RevisionId {
				t.Fatalf("RollbackSchema = %v, %v", third, err)
			}
			_, err = c.RollbackSchema(ctx, &pb.RollbackSchemaRequest{Name: name, RevisionId: "0000beef"})
			wantCode(t, "RollbackSchema(missing)", err, codes.NotFound)

			// Deleting an older revision returns the revision deleted, as
			// Google's emulator does; pstest the schema as it then is.
			got, err = c.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: name + "@" + first.RevisionId})
			if err != nil || got.RevisionId != map[bool]string{true: first.RevisionId, false: third.RevisionId}[b.service] {
				t.Fatalf("DeleteSchemaRevision(@first) = %v, %v; first %s, third %s", got, err, first.RevisionId, third.RevisionId)
			}
			if ids := revisionIDs(listRevisions(t, c, name, pb.SchemaView_BASIC)); len(ids) != 2 || slices.Contains(ids, first.RevisionId) {
				t.Fatalf("revisions after DeleteSchemaRevision = %v", ids)
			}
			_, err = c.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: name + "@0000beef"})
			wantCode(t, "DeleteSchemaRevision(missing)", err, codes.NotFound)
			_, err = c.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: name})
			wantCode(t, "DeleteSchemaRevision(no revision)", err, map[bool]codes.Code{true: codes.NotFound, false: codes.InvalidArgument}[b.emulator])

			// The only revision of a schema cannot be deleted:
			// INVALID_ARGUMENT, as Google's emulator and pstest answer
			// ("Cannot delete last revision. Please use DeleteSchema.").
			single := mustCreateSchema(t, c, srv.parent(), "single", pb.Schema_AVRO, schemaAvro)
			_, err = c.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: single.Name + "@" + single.RevisionId})
			wantCode(t, "DeleteSchemaRevision(only)", err, codes.InvalidArgument)

			// Both schemas are listed (pstest ignores views and pages).
			var names []string
			it := c.ListSchemas(ctx, &pb.ListSchemasRequest{Parent: srv.parent(), View: pb.SchemaView_FULL})
			for {
				s, err := it.Next()
				if err == iterator.Done {
					break
				}
				if err != nil {
					t.Fatalf("ListSchemas: %v", err)
				}
				if s.Definition == "" {
					t.Fatalf("ListSchemas(FULL) without definition: %v", s)
				}
				names = append(names, s.Name)
			}
			slices.Sort(names)
			if !slices.Equal(names, []string{srv.schema("single"), name}) {
				t.Fatalf("ListSchemas = %v", names)
			}

			// Deleting a schema deletes every revision.
			if err := c.DeleteSchema(ctx, &pb.DeleteSchemaRequest{Name: name}); err != nil {
				t.Fatalf("DeleteSchema: %v", err)
			}
			_, err = c.GetSchema(ctx, &pb.GetSchemaRequest{Name: name})
			wantCode(t, "GetSchema(deleted)", err, codes.NotFound)
			err = c.DeleteSchema(ctx, &pb.DeleteSchemaRequest{Name: name})
			wantCode(t, "DeleteSchema(deleted)", err, codes.NotFound)

			// A schema may be created again under a deleted name.
			again := mustCreateSchema(t, c, srv.parent(), "states", pb.Schema_AVRO, schemaAvroPlus)
			if revs := listRevisions(t, c, name, pb.SchemaView_BASIC); len(revs) != 1 || revs[0].RevisionId != again.RevisionId {
				t.Fatalf("revisions of the schema created again = %v", revs)
			}
		})
	}
}

// ValidateSchema and ValidateMessage. pstest only refuses an empty
// definition; the sidecar checks what the service checks.
func TestSchemaValidate(t *testing.T) {
	for _, b := range schemaBackends {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			srv := b.start(t)
			c, _ := schemaClients(t, srv.addr)
			parent := srv.parent()
			avro := mustCreateSchema(t, c, srv.parent(), "avro-states", pb.Schema_AVRO, schemaAvro)
			codec, err := goavro.NewCodec(schemaAvro)
			if err != nil {
				t.Fatal(err)
			}
			avroBinary, err := codec.BinaryFromNative(nil, map[string]any{"name": "Alaska", "post_abbr": "AK"})
			if err != nil {
				t.Fatal(err)
			}

			valid := []struct {
				name string
				req  *pb.ValidateSchemaRequest
			}{
				{"avro", &pb.ValidateSchemaRequest{Parent: parent, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: schemaAvro}}},
				{"proto", &pb.ValidateSchemaRequest{Parent: parent, Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: schemaProto}}},
			}
			for _, tt := range valid {
				if _, err := c.ValidateSchema(ctx, tt.req); b.emulatorProto(t, "ValidateSchema("+tt.name+")", tt.req.GetSchema().GetType(), err) {
					continue
				} else if err != nil {
					t.Errorf("ValidateSchema(%s) = %v", tt.name, err)
				}
			}
			_, err = c.ValidateSchema(ctx, &pb.ValidateSchemaRequest{Parent: parent, Schema: &pb.Schema{Type: pb.Schema_AVRO}})
			wantCode(t, "ValidateSchema(empty)", err, codes.InvalidArgument)

			invalidDefs := []struct {
				name string
				typ  pb.Schema_Type
				def  string
			}{
				{"avro syntax", pb.Schema_AVRO, `{"type":"record","name":"invalid","fields":[],}`},
				{"proto two top-level types", pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3"; message A {} message B {}`},
				{"proto import", pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3"; import "google/protobuf/timestamp.proto"; message A {}`},
			}
			for _, tt := range invalidDefs {
				_, err := c.ValidateSchema(ctx, &pb.ValidateSchemaRequest{Parent: parent, Schema: &pb.Schema{Type: tt.typ, Definition: tt.def}})
				_, cerr := c.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: parent, SchemaId: "bad-schema", Schema: &pb.Schema{Type: tt.typ, Definition: tt.def}})
				if b.emulatorProto(t, "ValidateSchema("+tt.name+")", tt.typ, err) {
					continue
				}
				if b.service {
					wantCode(t, "ValidateSchema("+tt.name+")", err, codes.InvalidArgument)
					wantCode(t, "CreateSchema("+tt.name+")", cerr, codes.InvalidArgument)
				} else if err != nil {
					t.Errorf("pstest ValidateSchema(%s) = %v", tt.name, err)
				}
			}

			validMsgs := []struct {
				name string
				req  *pb.ValidateMessageRequest
			}{
				{"avro json by name", &pb.ValidateMessageRequest{Parent: parent, SchemaSpec: &pb.ValidateMessageRequest_Name{Name: avro.Name},
					Encoding: pb.Encoding_JSON, Message: []byte(`{"name":"Alaska","post_abbr":"AK"}`)}},
				{"avro binary by name", &pb.ValidateMessageRequest{Parent: parent, SchemaSpec: &pb.ValidateMessageRequest_Name{Name: avro.Name},
					Encoding: pb.Encoding_BINARY, Message: avroBinary}},
				{"proto binary inline", &pb.ValidateMessageRequest{Parent: parent,
					SchemaSpec: &pb.ValidateMessageRequest_Schema{Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: schemaProto}},
					Encoding:   pb.Encoding_BINARY, Message: []byte(schemaProtoBinary)}},
				{"proto json inline", &pb.ValidateMessageRequest{Parent: parent,
					SchemaSpec: &pb.ValidateMessageRequest_Schema{Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: schemaProto}},
					Encoding:   pb.Encoding_JSON, Message: []byte(`{"name":"Alaska","postAbbr":"AK"}`)}},
			}
			for _, tt := range validMsgs {
				if _, err := c.ValidateMessage(ctx, tt.req); b.emulatorProto(t, "ValidateMessage("+tt.name+")", tt.req.GetSchema().GetType(), err) {
					continue
				} else if err != nil {
					t.Errorf("ValidateMessage(%s) = %v", tt.name, err)
				}
			}
			_, err = c.ValidateMessage(ctx, &pb.ValidateMessageRequest{Parent: parent, SchemaSpec: &pb.ValidateMessageRequest_Name{Name: srv.schema("nope")},
				Encoding: pb.Encoding_JSON, Message: []byte(`{}`)})
			wantCode(t, "ValidateMessage(missing schema)", err, codes.NotFound)

			invalidMsgs := []struct {
				name       string
				req        *pb.ValidateMessageRequest
				emulatorOK bool // Google's emulator takes it
			}{
				{"avro json wrong type", &pb.ValidateMessageRequest{Parent: parent, SchemaSpec: &pb.ValidateMessageRequest_Name{Name: avro.Name},
					Encoding: pb.Encoding_JSON, Message: []byte(`{"name":"Alaska","post_abbr":7}`)}, false},
				{"avro binary too much data", &pb.ValidateMessageRequest{Parent: parent, SchemaSpec: &pb.ValidateMessageRequest_Name{Name: avro.Name},
					Encoding: pb.Encoding_BINARY, Message: append(avroBinary, 0)}, true},
				{"proto json unknown field", &pb.ValidateMessageRequest{Parent: parent,
					SchemaSpec: &pb.ValidateMessageRequest_Schema{Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: schemaProto}},
					Encoding:   pb.Encoding_JSON, Message: []byte(`{"capital":"Juneau"}`)}, false},
			}
			for _, tt := range invalidMsgs {
				_, err := c.ValidateMessage(ctx, tt.req)
				if b.emulatorProto(t, "ValidateMessage("+tt.name+")", tt.req.GetSchema().GetType(), err) {
					continue
				}
				if b.emulator && tt.emulatorOK {
					wantCode(t, "the emulator's ValidateMessage("+tt.name+")", err, codes.OK)
					continue
				}
				if b.service {
					wantCode(t, "ValidateMessage("+tt.name+")", err, codes.InvalidArgument)
					// The emulator's words: "Could not parse JSON Avro message".
					if !b.emulator && !strings.HasPrefix(status.Convert(err).Message(), "Invalid data in message") {
						t.Errorf("ValidateMessage(%s) = %v, want Invalid data in message", tt.name, err)
					}
				} else if err != nil {
					t.Errorf("pstest ValidateMessage(%s) = %v", tt.name, err)
				}
			}
		})
	}
}

// Concurrent commits all land, each as its own revision: the sidecar
// updates the schema's record compare-and-set.
func TestSchemaConcurrentCommits(t *testing.T) {
	for _, b := range schemaBackends {
		t.Run(b.name, func(t *testing.T) {
			srv := b.start(t)
			c, _ := schemaClients(t, srv.addr)
			b.noProto(t, c, srv.parent())
			s := mustCreateSchema(t, c, srv.parent(), "busy", pb.Schema_PROTOCOL_BUFFER, schemaProto)
			const n = 8
			errs := make(chan error, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					// Each adds a different optional field, compatible with
					// the base schema and with every other.
					def := strings.Replace(schemaProto, "}", fmt.Sprintf("  string extra_%d = %d;\n}", i, 10+i), 1)
					_, err := c.CommitSchema(context.Background(), &pb.CommitSchemaRequest{Name: s.Name,
						Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: def}})
					errs <- err
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatalf("CommitSchema: %v", err)
				}
			}
			ids := revisionIDs(listRevisions(t, c, s.Name, pb.SchemaView_BASIC))
			slices.Sort(ids)
			if len(slices.Compact(ids)) != n+1 {
				t.Fatalf("revisions = %v, want %d distinct", ids, n+1)
			}
		})
	}
}

// What only the sidecar does, as the service does: names, paging, views,
// the revision rules.
func TestSchemaSidecarRules(t *testing.T) {
	ctx := context.Background()
	c, raw := schemaClients(t, itest.Start(t, sidecar.Config{}).GRPC)
	parent := "projects/" + project

	for _, id := range []string{"ab", "1abc", "goog-schema", "has space", "has/slash", "has@at"} {
		_, err := c.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: parent, SchemaId: id, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: schemaAvro}})
		wantCode(t, "CreateSchema(id "+id+")", err, codes.InvalidArgument)
	}
	_, err := c.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: parent, SchemaId: "untyped", Schema: &pb.Schema{Definition: schemaAvro}})
	wantCode(t, "CreateSchema(no type)", err, codes.InvalidArgument)

	for _, id := range []string{"s-c", "s-a", "s.b~+%"} {
		mustCreateSchema(t, c, "projects/"+project, id, pb.Schema_AVRO, schemaAvro)
	}
	// Pages in name order; BASIC (the default) has no definition.
	var got []string
	token := ""
	for {
		resp, err := raw.ListSchemas(ctx, &pb.ListSchemasRequest{Parent: parent, PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatalf("ListSchemas: %v", err)
		}
		if len(resp.Schemas) > 2 {
			t.Fatalf("ListSchemas page of %d", len(resp.Schemas))
		}
		for _, s := range resp.Schemas {
			if s.Definition != "" || s.Type != pb.Schema_AVRO {
				t.Fatalf("ListSchemas(BASIC) = %v", s)
			}
			got = append(got, s.Name)
		}
		if token = resp.NextPageToken; token == "" {
			break
		}
	}
	if want := []string{schemaPath("s-a"), schemaPath("s-c"), schemaPath("s.b~+%")}; !slices.Equal(got, want) {
		t.Fatalf("ListSchemas = %v, want %v", got, want)
	}

	// Revisions page newest first.
	name := schemaPath("s-a")
	var commits []string
	for range 4 {
		s, err := c.RollbackSchema(ctx, &pb.RollbackSchemaRequest{Name: name, RevisionId: listRevisions(t, c, name, pb.SchemaView_BASIC)[0].RevisionId})
		if err != nil {
			t.Fatalf("RollbackSchema: %v", err)
		}
		commits = append(commits, s.RevisionId)
	}
	var pages [][]string
	token = ""
	for {
		resp, err := raw.ListSchemaRevisions(ctx, &pb.ListSchemaRevisionsRequest{Name: name, PageSize: 2, PageToken: token})
		if err != nil {
			t.Fatalf("ListSchemaRevisions: %v", err)
		}
		pages = append(pages, revisionIDs(resp.Schemas))
		if token = resp.NextPageToken; token == "" {
			break
		}
	}
	if len(pages) != 3 || !slices.Equal(pages[0], []string{commits[3], commits[2]}) || !slices.Equal(pages[1], []string{commits[1], commits[0]}) || len(pages[2]) != 1 {
		t.Fatalf("ListSchemaRevisions pages = %v, commits %v", pages, commits)
	}

	// A revision must be compatible with the current one.
	incompatible := []string{
		`{"type":"record","name":"State","namespace":"utilities","fields":[{"name":"name","type":"string"},{"name":"post_abbr","type":"int"}]}`,
		`{"type":"record","name":"State","namespace":"utilities","fields":[{"name":"name","type":"string"},{"name":"post_abbr","type":"string"},{"name":"pop","type":"long"}]}`,
	}
	for _, def := range incompatible {
		_, err := c.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: name, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: def}})
		wantCode(t, "CommitSchema(incompatible)", err, codes.InvalidArgument)
	}
	_, err = c.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: name, Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: schemaProto}})
	wantCode(t, "CommitSchema(other type)", err, codes.InvalidArgument)
	_, err = c.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: schemaPath("nope"), Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: schemaAvro}})
	wantCode(t, "CommitSchema(missing)", err, codes.NotFound)
	_, err = c.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: name + "@" + commits[0], Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: schemaAvro}})
	wantCode(t, "CommitSchema(name@revision)", err, codes.InvalidArgument)

	// At most 20 revisions: s-a has 5.
	for range 15 {
		if _, err := c.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: name, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: schemaAvroPlus}}); err != nil {
			t.Fatalf("CommitSchema: %v", err)
		}
	}
	_, err = c.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: name, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: schemaAvroPlus}})
	wantCode(t, "CommitSchema(21st)", err, codes.ResourceExhausted)
	if _, err := c.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: name + "@" + commits[0]}); err != nil {
		t.Fatalf("DeleteSchemaRevision: %v", err)
	}
	if _, err := c.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: name, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: schemaAvroPlus}}); err != nil {
		t.Fatalf("CommitSchema after a delete: %v", err)
	}
}

// Topics with schema settings, through Google's Go client. pstest keeps
// whatever schema settings it is given and validates nothing on publish;
// where the sidecar answers as the service does and pstest does not, each
// side is asserted (docs/SIDECAR.md lists the differences).

// schemaTopicEnv is a backend's clients for the topic tests.
type schemaTopicEnv struct {
	schemaServer
	schemas *vkit.SchemaClient
	c       *pubsub.Client
}

func startSchemaTopicEnv(t *testing.T, b schemaBackend) schemaTopicEnv {
	t.Helper()
	srv := b.start(t)
	sc, _ := schemaClients(t, srv.addr)
	return schemaTopicEnv{schemaServer: srv, schemas: sc, c: itest.GoClientOf(t, srv.addr, srv.project)}
}

func (e schemaTopicEnv) getTopic(t *testing.T, id string) *pb.Topic {
	t.Helper()
	got, err := e.c.TopicAdminClient.GetTopic(context.Background(), &pb.GetTopicRequest{Topic: e.topic(id)})
	if err != nil {
		t.Fatalf("GetTopic(%s): %v", id, err)
	}
	return got
}

// wantSchemaSettings fails unless topic id has settings want (nil: none).
func (e schemaTopicEnv) wantSchemaSettings(t *testing.T, id string, want *pb.SchemaSettings) {
	t.Helper()
	if got := e.getTopic(t, id).GetSchemaSettings(); !proto.Equal(got, want) {
		t.Fatalf("schema settings of %s = %v, want %v", id, got, want)
	}
}

// publishBatch publishes data as one request, every message with key.
func (e schemaTopicEnv) publishBatch(topic, key string, data ...[]byte) error {
	req := &pb.PublishRequest{Topic: e.topic(topic)}
	for _, d := range data {
		req.Messages = append(req.Messages, &pb.PubsubMessage{Data: d, OrderingKey: key})
	}
	_, err := e.c.TopicAdminClient.Publish(context.Background(), req)
	return err
}

func (e schemaTopicEnv) updateTopic(topic *pb.Topic, paths ...string) (*pb.Topic, error) {
	return e.c.TopicAdminClient.UpdateTopic(context.Background(), &pb.UpdateTopicRequest{Topic: topic, UpdateMask: fieldMask(paths...)})
}

// pullUntil pulls from sub, acking what it gets, until a message for which
// last is true arrives, and returns every message in the order received.
func (e schemaTopicEnv) pullUntil(t *testing.T, sub string, last func(*pb.PubsubMessage) bool) []*pb.PubsubMessage {
	t.Helper()
	var got []*pb.PubsubMessage
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := e.c.SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: e.sub(sub), MaxMessages: 100})
		cancel()
		if err != nil && status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("Pull(%s): %v", sub, err)
		}
		var ackIDs []string
		for _, rm := range resp.GetReceivedMessages() {
			got = append(got, rm.GetMessage())
			ackIDs = append(ackIDs, rm.GetAckId())
		}
		if len(ackIDs) > 0 {
			if err := e.c.SubscriptionAdminClient.Acknowledge(context.Background(),
				&pb.AcknowledgeRequest{Subscription: e.sub(sub), AckIds: ackIDs}); err != nil {
				t.Fatalf("Acknowledge: %v", err)
			}
		}
		if slices.ContainsFunc(got, last) {
			return got
		}
	}
	t.Fatalf("%s: the last message not received within 30s; got %q", sub, dataOf(got))
	return nil
}

func isMarker(m *pb.PubsubMessage) bool { return m.GetAttributes()["marker"] != "" }

func dataOf(msgs []*pb.PubsubMessage) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, string(m.GetData()))
	}
	return out
}

// avroStateBinary is Alaska in the binary encoding of schemaAvro.
func avroStateBinary(t *testing.T) []byte {
	t.Helper()
	codec, err := goavro.NewCodec(schemaAvro)
	if err != nil {
		t.Fatal(err)
	}
	b, err := codec.BinaryFromNative(nil, map[string]any{"name": "Alaska", "post_abbr": "AK"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A topic with Avro or Protocol Buffer schema settings, in JSON or binary:
// valid messages are stored, with the schema attributes the service sets;
// a request with one invalid message fails whole, INVALID_ARGUMENT, and
// stores nothing (a subscription receives nothing of it).
func TestSchemaTopicPublish(t *testing.T) {
	avroBinary := avroStateBinary(t)
	cases := []struct {
		id      string
		typ     pb.Schema_Type
		def     string
		enc     pb.Encoding
		valid   []byte
		invalid []byte
	}{
		{"avro-json", pb.Schema_AVRO, schemaAvro, pb.Encoding_JSON,
			[]byte(`{"name":"Alaska","post_abbr":"AK"}`), []byte(`{"name":"Alaska","post_abbr":7}`)},
		{"avro-binary", pb.Schema_AVRO, schemaAvro, pb.Encoding_BINARY, avroBinary, append(slices.Clone(avroBinary), 0)},
		{"proto-json", pb.Schema_PROTOCOL_BUFFER, schemaProto, pb.Encoding_JSON,
			[]byte(`{"name":"Alaska","postAbbr":"AK"}`), []byte(`{"capital":"Juneau"}`)},
		{"proto-binary", pb.Schema_PROTOCOL_BUFFER, schemaProto, pb.Encoding_BINARY,
			[]byte(schemaProtoBinary), []byte(schemaProtoBinary[:5])}, // cut inside the name
	}
	for _, b := range schemaBackends {
		t.Run(b.name, func(t *testing.T) {
			e := startSchemaTopicEnv(t, b)
			ctx := context.Background()
			for _, tt := range cases {
				t.Run(tt.id, func(t *testing.T) {
					if tt.typ == pb.Schema_PROTOCOL_BUFFER {
						b.noProto(t, e.schemas, e.parent())
					}
					sch := mustCreateSchema(t, e.schemas, e.parent(), tt.id, tt.typ, tt.def)
					settings := &pb.SchemaSettings{Schema: sch.Name, Encoding: tt.enc}
					created, err := e.c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: e.topic(tt.id), SchemaSettings: settings})
					if err != nil || !proto.Equal(created.GetSchemaSettings(), settings) {
						t.Fatalf("CreateTopic = %v, %v", created, err)
					}
					e.wantSchemaSettings(t, tt.id, settings)
					mustCreateSub(t, e.c, &pb.Subscription{Name: e.sub(tt.id), Topic: e.topic(tt.id), EnableMessageOrdering: true})

					// Every message has key k: the subscription receives them in the order stored.
					pub := e.c.Publisher(tt.id)
					pub.EnableMessageOrdering = true
					defer pub.Stop()
					if _, err := pub.Publish(ctx, &pubsub.Message{Data: tt.valid, OrderingKey: "k"}).Get(ctx); err != nil {
						t.Fatalf("Publish(valid): %v", err)
					}
					// One request with one bad message in the middle, and a bad one alone.
					err = e.publishBatch(tt.id, "k", tt.valid, tt.invalid, tt.valid)
					_, alone := pub.Publish(ctx, &pubsub.Message{Data: tt.invalid, OrderingKey: "k"}).Get(ctx)
					if b.emulator && tt.enc == pb.Encoding_BINARY {
						// It takes Avro binary with a byte too many.
						wantCode(t, "the emulator's Publish(a byte too many)", err, codes.OK)
						wantCode(t, "the emulator's Publisher.Publish(a byte too many)", alone, codes.OK)
						return
					}
					if b.service {
						wantCode(t, "Publish(a request with an invalid message)", err, codes.InvalidArgument)
						msg := status.Convert(err).Message()
						if b.emulator { // its words: "Could not parse message"
							msg = "Invalid data in message: Message failed schema validation. messages[1] " + sch.Name
						}
						if !strings.HasPrefix(msg, "Invalid data in message: Message failed schema validation.") ||
							!strings.Contains(msg, "messages[1]") || !strings.Contains(msg, sch.Name) {
							t.Fatalf("Publish(a request with an invalid message) = %q, want the service's words, the message at fault and why", msg)
						}
						wantCode(t, "Publisher.Publish(invalid)", alone, codes.InvalidArgument)
					} else if err != nil || alone != nil { // pstest validates nothing
						t.Fatalf("pstest Publish(invalid) = %v, %v", err, alone)
					}
					if err := e.publishBatch(tt.id, "k", tt.valid); err != nil {
						t.Fatalf("Publish(valid again): %v", err)
					}
					// The marker, last, is a valid message too.
					if _, err := e.c.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: e.topic(tt.id), Messages: []*pb.PubsubMessage{
						{Data: tt.valid, OrderingKey: "k", Attributes: map[string]string{"marker": "1"}},
					}}); err != nil {
						t.Fatalf("Publish(marker): %v", err)
					}
					got := e.pullUntil(t, tt.id, isMarker)
					if !b.service {
						// pstest stored everything: 1 + 3 + 1 + 1, and the marker.
						if len(got) != 7 {
							t.Fatalf("pstest received %d messages: %q", len(got), dataOf(got))
						}
						return
					}
					if len(got) != 3 {
						t.Fatalf("received %d messages (%q), want the 3 valid ones alone", len(got), dataOf(got))
					}
					for i, m := range got {
						if !bytes.Equal(m.GetData(), tt.valid) {
							t.Fatalf("message %d = %q: a message of a refused request was stored", i, m.GetData())
						}
						attrs := m.GetAttributes()
						if attrs["googclient_schemaname"] != sch.Name || attrs["googclient_schemaencoding"] != tt.enc.String() ||
							attrs["googclient_schemarevisionid"] != sch.RevisionId {
							t.Fatalf("message %d attributes = %v, want the schema's", i, attrs)
						}
					}
				})
			}
		})
	}
}

// A revision range: a message is accepted if any revision from first to
// last accepts it, and carries the id of the newest that does. The range
// changes by UpdateTopic of its fields, as the service's samples do; a
// range that names a missing revision, or runs backwards, is refused and
// changes nothing.
func TestSchemaTopicRevisions(t *testing.T) {
	withPop := strings.Replace(schemaProto, "}", "  int64 population = 3;\n}", 1)
	const (
		plain = `{"name":"Alaska","postAbbr":"AK"}`
		pop   = `{"name":"Alaska","population":"733391"}` // from r2 on
	)
	for _, b := range schemaBackends {
		t.Run(b.name, func(t *testing.T) {
			e := startSchemaTopicEnv(t, b)
			b.noProto(t, e.schemas, e.parent())
			ctx := context.Background()
			r1 := mustCreateSchema(t, e.schemas, e.parent(), "states", pb.Schema_PROTOCOL_BUFFER, schemaProto)
			r2, err := e.schemas.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: r1.Name,
				Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: withPop}})
			if err != nil {
				t.Fatal(err)
			}
			onlyR1 := &pb.SchemaSettings{Schema: r1.Name, Encoding: pb.Encoding_JSON, FirstRevisionId: r1.RevisionId, LastRevisionId: r1.RevisionId}
			if _, err := e.c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: e.topic("states"), SchemaSettings: onlyR1}); err != nil {
				t.Fatal(err)
			}
			e.wantSchemaSettings(t, "states", onlyR1)
			mustCreateSub(t, e.c, &pb.Subscription{Name: e.sub("states"), Topic: e.topic("states"), EnableMessageOrdering: true})

			err = e.publishBatch("states", "k", []byte(pop))
			if b.service {
				wantCode(t, "Publish(pop, r1 only)", err, codes.InvalidArgument)
			} else if err != nil {
				t.Fatalf("pstest Publish(pop): %v", err)
			}
			if err := e.publishBatch("states", "k", []byte(plain)); err != nil {
				t.Fatalf("Publish(plain, r1 only): %v", err)
			}

			// Up to r2, by the field alone.
			upToR2 := proto.CloneOf(onlyR1)
			upToR2.LastRevisionId = r2.RevisionId
			got, err := e.updateTopic(&pb.Topic{Name: e.topic("states"), SchemaSettings: &pb.SchemaSettings{LastRevisionId: r2.RevisionId}},
				"schema_settings.last_revision_id")
			if err != nil || !proto.Equal(got.GetSchemaSettings(), upToR2) {
				t.Fatalf("UpdateTopic(last_revision_id) = %v, %v", got, err)
			}
			e.wantSchemaSettings(t, "states", upToR2)
			if err := e.publishBatch("states", "k", []byte(pop)); err != nil {
				t.Fatalf("Publish(pop, r1 to r2): %v", err)
			}
			if _, err := e.c.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: e.topic("states"), Messages: []*pb.PubsubMessage{
				{Data: []byte(plain), OrderingKey: "k", Attributes: map[string]string{"marker": "1"}},
			}}); err != nil {
				t.Fatalf("Publish(marker): %v", err)
			}
			msgs := e.pullUntil(t, "states", isMarker)
			if b.service {
				// plain against r1 only; then pop and plain, r2 the newest that takes them.
				wantData := []string{plain, pop, plain}
				wantRevs := []string{r1.RevisionId, r2.RevisionId, r2.RevisionId}
				var revs []string
				for _, m := range msgs {
					revs = append(revs, m.GetAttributes()["googclient_schemarevisionid"])
				}
				if !slices.Equal(dataOf(msgs), wantData) || !slices.Equal(revs, wantRevs) {
					t.Fatalf("received %q with revisions %q, want %q with %q", dataOf(msgs), revs, wantData, wantRevs)
				}
			} else if len(msgs) != 4 {
				t.Fatalf("pstest received %q", dataOf(msgs))
			}

			// Backwards, and missing revisions. pstest stores whatever it is
			// given, so only the sidecar is asked.
			if !b.service {
				return
			}
			bad := []struct {
				what     string
				settings *pb.SchemaSettings
				paths    []string
				want     codes.Code
			}{
				{"backwards", &pb.SchemaSettings{FirstRevisionId: r2.RevisionId, LastRevisionId: r1.RevisionId},
					[]string{"schema_settings.first_revision_id", "schema_settings.last_revision_id"}, codes.InvalidArgument},
				{"missing first", &pb.SchemaSettings{FirstRevisionId: "0000beef"}, []string{"schema_settings.first_revision_id"}, codes.NotFound},
				{"missing last", &pb.SchemaSettings{Schema: r1.Name, Encoding: pb.Encoding_JSON, LastRevisionId: "0000beef"},
					[]string{"schema_settings"}, codes.NotFound},
			}
			for _, tt := range bad {
				_, err := e.updateTopic(&pb.Topic{Name: e.topic("states"), SchemaSettings: tt.settings}, tt.paths...)
				wantCode(t, "UpdateTopic("+tt.what+")", err, tt.want)
				e.wantSchemaSettings(t, "states", upToR2)
				full := proto.CloneOf(upToR2)
				proto.Merge(full, tt.settings)
				_, err = e.c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: e.topic("bad"), SchemaSettings: full})
				wantCode(t, "CreateTopic("+tt.what+")", err, tt.want)
				_, err = e.c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: e.topic("bad")})
				wantCode(t, "GetTopic of the topic refused", err, codes.NotFound)
			}
		})
	}
}

// Schema settings set, changed field by field and removed by UpdateTopic
// take effect for the next Publish; bad settings are refused and change
// nothing. Ingestion settings stay refused.
func TestSchemaTopicUpdate(t *testing.T) {
	avroBinary := avroStateBinary(t)
	const avroJSON = `{"name":"Alaska","post_abbr":"AK"}`
	for _, b := range schemaBackends {
		t.Run(b.name, func(t *testing.T) {
			e := startSchemaTopicEnv(t, b)
			ctx := context.Background()
			sch := mustCreateSchema(t, e.schemas, e.parent(), "states", pb.Schema_AVRO, schemaAvro)
			mustCreateTopic(t, e.c, "states")
			e.wantSchemaSettings(t, "states", nil)
			// Without schema anything goes; the sidecar now caches that.
			if err := e.publishBatch("states", "", []byte("anything")); err != nil {
				t.Fatalf("Publish without schema: %v", err)
			}

			jsonSettings := &pb.SchemaSettings{Schema: sch.Name, Encoding: pb.Encoding_JSON}
			got, err := e.updateTopic(&pb.Topic{Name: e.topic("states"), SchemaSettings: jsonSettings}, "schema_settings")
			if err != nil || !proto.Equal(got.GetSchemaSettings(), jsonSettings) {
				t.Fatalf("UpdateTopic(schema_settings) = %v, %v", got, err)
			}
			e.wantSchemaSettings(t, "states", jsonSettings)
			err = e.publishBatch("states", "", []byte("anything"))
			if b.service {
				wantCode(t, "Publish(not Avro JSON) right after the update", err, codes.InvalidArgument)
			} else if err != nil {
				t.Fatalf("pstest Publish: %v", err)
			}
			if err := e.publishBatch("states", "", []byte(avroJSON)); err != nil {
				t.Fatalf("Publish(Avro JSON): %v", err)
			}

			// One field: the encoding.
			binarySettings := &pb.SchemaSettings{Schema: sch.Name, Encoding: pb.Encoding_BINARY}
			if got, err := e.updateTopic(&pb.Topic{Name: e.topic("states"), SchemaSettings: &pb.SchemaSettings{Encoding: pb.Encoding_BINARY}},
				"schema_settings.encoding"); err != nil || !proto.Equal(got.GetSchemaSettings(), binarySettings) {
				t.Fatalf("UpdateTopic(schema_settings.encoding) = %v, %v", got, err)
			}
			if err := e.publishBatch("states", "", avroBinary); err != nil {
				t.Fatalf("Publish(Avro binary): %v", err)
			}
			err = e.publishBatch("states", "", []byte(avroJSON))
			if b.service {
				wantCode(t, "Publish(Avro JSON) to a binary topic", err, codes.InvalidArgument)
			} else if err != nil {
				t.Fatalf("pstest Publish: %v", err)
			}

			// Bad settings: refused, the topic keeps its settings. pstest
			// stores whatever it is given, so only the sidecar is asked.
			if b.service {
				bad := []struct {
					what     string
					settings *pb.SchemaSettings
					paths    []string
					want     codes.Code
				}{
					{"missing schema", &pb.SchemaSettings{Schema: e.schema("nope"), Encoding: pb.Encoding_JSON}, []string{"schema_settings"}, codes.NotFound},
					{"no encoding", &pb.SchemaSettings{Schema: sch.Name}, []string{"schema_settings"}, codes.InvalidArgument},
					{"no schema", &pb.SchemaSettings{}, []string{"schema_settings.schema"}, codes.InvalidArgument},
					{"bad schema name", &pb.SchemaSettings{Schema: "states"}, []string{"schema_settings.schema"}, codes.InvalidArgument},
					{"deleted-schema marker", &pb.SchemaSettings{Schema: "_deleted-schema_", Encoding: pb.Encoding_JSON},
						[]string{"schema_settings"}, codes.InvalidArgument},
					{"unknown field", &pb.SchemaSettings{}, []string{"schema_settings.nope"}, codes.InvalidArgument},
					{"ingestion", nil, []string{"ingestion_data_source_settings"}, codes.InvalidArgument},
				}
				// Google's emulator looks a schema name that is not one up.
				// It takes ingestion settings.
				emulatorCodes := map[string]codes.Code{"bad schema name": codes.NotFound, "deleted-schema marker": codes.NotFound, "ingestion": codes.OK}
				for _, tt := range bad {
					_, err := e.updateTopic(&pb.Topic{Name: e.topic("states"), SchemaSettings: tt.settings}, tt.paths...)
					if c, ok := emulatorCodes[tt.what]; ok && b.emulator {
						tt.want = c
					}
					wantCode(t, "UpdateTopic("+tt.what+")", err, tt.want)
					e.wantSchemaSettings(t, "states", binarySettings)
				}
				if err := e.publishBatch("states", "", avroBinary); err != nil {
					t.Fatalf("Publish(Avro binary) after refused updates: %v", err)
				}
				_, err := e.c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: e.topic("ingest"),
					IngestionDataSourceSettings: &pb.IngestionDataSourceSettings{}})
				wantCode(t, "CreateTopic(ingestion)", err, codes.InvalidArgument)
			}

			// Removed: anything goes again, at once.
			got, err = e.updateTopic(&pb.Topic{Name: e.topic("states")}, "schema_settings")
			if err != nil || got.GetSchemaSettings() != nil {
				t.Fatalf("UpdateTopic(remove schema_settings) = %v, %v", got, err)
			}
			e.wantSchemaSettings(t, "states", nil)
			if err := e.publishBatch("states", "", []byte("anything")); err != nil {
				t.Fatalf("Publish after the settings were removed: %v", err)
			}
		})
	}
}

// Once its schema is deleted, a topic shows schema "_deleted-schema_"
// (also after a schema of the same name is created again), and Publish
// refuses every message, until the topic is given a schema again.
func TestSchemaTopicDeletedSchema(t *testing.T) {
	const valid = `{"name":"Alaska","post_abbr":"AK"}`
	for _, b := range schemaBackends {
		t.Run(b.name, func(t *testing.T) {
			e := startSchemaTopicEnv(t, b)
			ctx := context.Background()
			sch := mustCreateSchema(t, e.schemas, e.parent(), "doomed", pb.Schema_AVRO, schemaAvro)
			settings := &pb.SchemaSettings{Schema: sch.Name, Encoding: pb.Encoding_JSON}
			if _, err := e.c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: e.topic("states"), SchemaSettings: settings}); err != nil {
				t.Fatal(err)
			}
			if err := e.publishBatch("states", "", []byte(valid)); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			if err := e.schemas.DeleteSchema(ctx, &pb.DeleteSchemaRequest{Name: sch.Name}); err != nil {
				t.Fatal(err)
			}

			// The service shows _deleted-schema_ and refuses messages;
			// pstest keeps the name and takes them.
			deleted := &pb.SchemaSettings{Schema: "_deleted-schema_", Encoding: pb.Encoding_JSON}
			want := map[bool]*pb.SchemaSettings{true: deleted, false: settings}[b.service]
			e.wantSchemaSettings(t, "states", want)
			it := e.c.TopicAdminClient.ListTopics(ctx, &pb.ListTopicsRequest{Project: e.parent()})
			listed, err := it.Next()
			if err != nil || listed.Name != e.topic("states") || !proto.Equal(listed.SchemaSettings, want) {
				t.Fatalf("ListTopics = %v, %v", listed, err)
			}
			err = e.publishBatch("states", "", []byte(valid))
			if b.service {
				wantCode(t, "Publish to a topic whose schema was deleted", err, codes.NotFound)
			} else if err != nil {
				t.Fatalf("pstest Publish: %v", err)
			}
			if !b.service {
				return
			}

			// A schema created again under the name is another schema.
			again := mustCreateSchema(t, e.schemas, e.parent(), "doomed", pb.Schema_AVRO, schemaAvro)
			e.wantSchemaSettings(t, "states", deleted)
			wantCode(t, "Publish after the schema was created again", e.publishBatch("states", "", []byte(valid)), codes.NotFound)
			// Changing a field keeps naming the deleted schema: refused.
			_, err = e.updateTopic(&pb.Topic{Name: e.topic("states"), SchemaSettings: &pb.SchemaSettings{Encoding: pb.Encoding_BINARY}},
				"schema_settings.encoding")
			wantCode(t, "UpdateTopic(encoding) of settings naming a deleted schema", err,
				map[bool]codes.Code{true: codes.NotFound, false: codes.InvalidArgument}[b.emulator]) // the emulator looks "_deleted-schema_" up
			e.wantSchemaSettings(t, "states", deleted)

			// Given the new schema, the topic takes messages again.
			if _, err := e.updateTopic(&pb.Topic{Name: e.topic("states"), SchemaSettings: &pb.SchemaSettings{Schema: again.Name}},
				"schema_settings.schema"); err != nil {
				t.Fatalf("UpdateTopic(schema_settings.schema): %v", err)
			}
			e.wantSchemaSettings(t, "states", settings)
			if err := e.publishBatch("states", "", []byte(valid)); err != nil {
				t.Fatalf("Publish with the schema set again: %v", err)
			}
			_, err = e.c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: e.topic("marker"), SchemaSettings: deleted})
			wantCode(t, "CreateTopic(_deleted-schema_)", err, map[bool]codes.Code{true: codes.NotFound, false: codes.InvalidArgument}[b.emulator])
		})
	}
}
