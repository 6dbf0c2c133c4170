package integration

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/linkedin/goavro/v2"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

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

// schemaBackend is a server of the SchemaService: Google's fake, or the
// sidecar.
type schemaBackend struct {
	name    string
	sidecar bool
	start   func(t *testing.T) (addr string)
}

var schemaBackends = []schemaBackend{
	{name: "pstest", start: func(t *testing.T) string {
		srv := pstest.NewServer()
		t.Cleanup(func() { _ = srv.Close() })
		return srv.Addr
	}},
	{name: "sidecar", sidecar: true, start: func(t *testing.T) string {
		return startSidecar(t, sidecar.Config{}).at.GRPC
	}},
}

// schemaClients are Google's schema admin client and a bare gRPC client
// (for page tokens, which the admin client's iterators hide) of addr.
func schemaClients(t *testing.T, addr string) (*vkit.SchemaClient, pb.SchemaServiceClient) {
	t.Helper()
	sc, err := vkit.NewSchemaClient(context.Background(),
		option.WithEndpoint(addr),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		option.WithTelemetryDisabled())
	if err != nil {
		t.Fatalf("NewSchemaClient: %v", err)
	}
	t.Cleanup(func() { _ = sc.Close() })
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return sc, pb.NewSchemaServiceClient(conn)
}

func schemaPath(id string) string { return "projects/" + project + "/schemas/" + id }

func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: code %v (%v), want %v", what, got, err, want)
	}
}

func mustCreateSchema(t *testing.T, c *vkit.SchemaClient, id string, typ pb.Schema_Type, def string) *pb.Schema {
	t.Helper()
	s, err := c.CreateSchema(context.Background(), &pb.CreateSchemaRequest{
		Parent: "projects/" + project, SchemaId: id, Schema: &pb.Schema{Type: typ, Definition: def},
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
			c, _ := schemaClients(t, b.start(t))
			name := schemaPath("states")

			first := mustCreateSchema(t, c, "states", pb.Schema_AVRO, schemaAvro)
			if first.Name != name || first.Type != pb.Schema_AVRO || first.Definition != schemaAvro ||
				!revisionIDPattern.MatchString(first.RevisionId) || first.RevisionCreateTime == nil {
				t.Fatalf("CreateSchema = %v", first)
			}

			// A second schema of the same id: the service answers
			// ALREADY_EXISTS; pstest adds a revision.
			_, err := c.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + project, SchemaId: "states",
				Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: schemaAvro}})
			if b.sidecar {
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
			if b.sidecar && got.Definition != "" {
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
			// "the name includes the revision ID"); pstest with the bare name.
			got, err = c.GetSchema(ctx, &pb.GetSchemaRequest{Name: name + "@" + first.RevisionId, View: pb.SchemaView_FULL})
			if err != nil || got.RevisionId != first.RevisionId || got.Definition != schemaAvro {
				t.Fatalf("GetSchema(@first) = %v, %v", got, err)
			}
			if wantName := map[bool]string{true: name + "@" + first.RevisionId, false: name}[b.sidecar]; got.Name != wantName {
				t.Fatalf("GetSchema(@first).Name = %q, want %q", got.Name, wantName)
			}
			_, err = c.GetSchema(ctx, &pb.GetSchemaRequest{Name: name + "@0000beef"})
			wantCode(t, "GetSchema(@missing)", err, codes.NotFound)

			// Revisions: the service lists them newest first (AIP-162),
			// named name@revision; pstest oldest first, with the bare name.
			revs := listRevisions(t, c, name, pb.SchemaView_FULL)
			ids := revisionIDs(revs)
			if b.sidecar {
				if !slices.Equal(ids, []string{second.RevisionId, first.RevisionId}) || revs[0].Name != name+"@"+second.RevisionId ||
					revs[0].Definition != schemaAvroPlus {
					t.Fatalf("ListSchemaRevisions = %v", revs)
				}
			} else if !slices.Equal(ids, []string{first.RevisionId, second.RevisionId}) {
				t.Fatalf("pstest ListSchemaRevisions = %v", ids)
			}

			// Rollback makes a new revision with the old definition.
			third, err := c.RollbackSchema(ctx, &pb.RollbackSchemaRequest{Name: name, RevisionId: first.RevisionId})
			if err != nil || third.Definition != schemaAvro || third.RevisionId == first.RevisionId || third.RevisionId == second.RevisionId {
				t.Fatalf("RollbackSchema = %v, %v", third, err)
			}
			_, err = c.RollbackSchema(ctx, &pb.RollbackSchemaRequest{Name: name, RevisionId: "0000beef"})
			wantCode(t, "RollbackSchema(missing)", err, codes.NotFound)

			// Deleting an older revision returns the schema as it then is.
			got, err = c.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: name + "@" + first.RevisionId})
			if err != nil || got.RevisionId != third.RevisionId {
				t.Fatalf("DeleteSchemaRevision(@first) = %v, %v", got, err)
			}
			if ids := revisionIDs(listRevisions(t, c, name, pb.SchemaView_BASIC)); len(ids) != 2 || slices.Contains(ids, first.RevisionId) {
				t.Fatalf("revisions after DeleteSchemaRevision = %v", ids)
			}
			_, err = c.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: name + "@0000beef"})
			wantCode(t, "DeleteSchemaRevision(missing)", err, codes.NotFound)
			_, err = c.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: name})
			wantCode(t, "DeleteSchemaRevision(no revision)", err, codes.InvalidArgument)

			// The only revision of a schema cannot be deleted: AIP-162 says
			// FAILED_PRECONDITION; pstest answers INVALID_ARGUMENT.
			single := mustCreateSchema(t, c, "single", pb.Schema_PROTOCOL_BUFFER, schemaProto)
			_, err = c.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: single.Name + "@" + single.RevisionId})
			wantCode(t, "DeleteSchemaRevision(only)", err, map[bool]codes.Code{true: codes.FailedPrecondition, false: codes.InvalidArgument}[b.sidecar])

			// Both schemas are listed (pstest ignores views and pages).
			var names []string
			it := c.ListSchemas(ctx, &pb.ListSchemasRequest{Parent: "projects/" + project, View: pb.SchemaView_FULL})
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
			if !slices.Equal(names, []string{schemaPath("single"), name}) {
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
			again := mustCreateSchema(t, c, "states", pb.Schema_AVRO, schemaAvroPlus)
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
			c, _ := schemaClients(t, b.start(t))
			parent := "projects/" + project
			avro := mustCreateSchema(t, c, "avro-states", pb.Schema_AVRO, schemaAvro)
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
				if _, err := c.ValidateSchema(ctx, tt.req); err != nil {
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
				if b.sidecar {
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
				if _, err := c.ValidateMessage(ctx, tt.req); err != nil {
					t.Errorf("ValidateMessage(%s) = %v", tt.name, err)
				}
			}
			_, err = c.ValidateMessage(ctx, &pb.ValidateMessageRequest{Parent: parent, SchemaSpec: &pb.ValidateMessageRequest_Name{Name: schemaPath("nope")},
				Encoding: pb.Encoding_JSON, Message: []byte(`{}`)})
			wantCode(t, "ValidateMessage(missing schema)", err, codes.NotFound)

			invalidMsgs := []struct {
				name string
				req  *pb.ValidateMessageRequest
			}{
				{"avro json wrong type", &pb.ValidateMessageRequest{Parent: parent, SchemaSpec: &pb.ValidateMessageRequest_Name{Name: avro.Name},
					Encoding: pb.Encoding_JSON, Message: []byte(`{"name":"Alaska","post_abbr":7}`)}},
				{"avro binary too much data", &pb.ValidateMessageRequest{Parent: parent, SchemaSpec: &pb.ValidateMessageRequest_Name{Name: avro.Name},
					Encoding: pb.Encoding_BINARY, Message: append(avroBinary, 0)}},
				{"proto json unknown field", &pb.ValidateMessageRequest{Parent: parent,
					SchemaSpec: &pb.ValidateMessageRequest_Schema{Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: schemaProto}},
					Encoding:   pb.Encoding_JSON, Message: []byte(`{"capital":"Juneau"}`)}},
			}
			for _, tt := range invalidMsgs {
				_, err := c.ValidateMessage(ctx, tt.req)
				if b.sidecar {
					wantCode(t, "ValidateMessage("+tt.name+")", err, codes.InvalidArgument)
					if !strings.HasPrefix(status.Convert(err).Message(), "Invalid data in message") {
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
			c, _ := schemaClients(t, b.start(t))
			s := mustCreateSchema(t, c, "busy", pb.Schema_PROTOCOL_BUFFER, schemaProto)
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
	c, raw := schemaClients(t, startSidecar(t, sidecar.Config{}).at.GRPC)
	parent := "projects/" + project

	for _, id := range []string{"ab", "1abc", "goog-schema", "has space", "has/slash", "has@at"} {
		_, err := c.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: parent, SchemaId: id, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: schemaAvro}})
		wantCode(t, "CreateSchema(id "+id+")", err, codes.InvalidArgument)
	}
	_, err := c.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: parent, SchemaId: "untyped", Schema: &pb.Schema{Definition: schemaAvro}})
	wantCode(t, "CreateSchema(no type)", err, codes.InvalidArgument)

	for _, id := range []string{"s-c", "s-a", "s.b~+%"} {
		mustCreateSchema(t, c, id, pb.Schema_AVRO, schemaAvro)
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
