// Package schemaapi serves the Google Pub/Sub v1 SchemaService
// (google.pubsub.v1.SchemaService) over a JetStream KV bucket, and gives
// the Publisher service (internal/pubsubapi) what it needs of schemas: the
// check of a topic's schema settings (Server.CheckSettings), how GetTopic
// shows them (Server.SettingsOf) and the validation of what is published
// (Server.Validator). Parsing definitions and validating messages against
// them is package schema's; this package keeps schemas, their revisions and
// the rules between them.
package schemaapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetorder/jetorder/internal/grpcutil"
	"github.com/jetorder/jetorder/internal/schema"
	"github.com/jetorder/jetorder/keyrouter"
)

// The SchemaService follows the service's documented rules and AIP-162
// (resource revisions, the version with name@revision that Pub/Sub uses):
//
//   - Schema ids follow the rule of topic ids (pubsub-basics#resource_names).
//   - A revision id is 8 random hex characters; revision_create_time is the
//     commit time. CreateSchema, CommitSchema and RollbackSchema each add one.
//   - A schema holds at most 20 revisions; the only one left cannot be
//     deleted (FAILED_PRECONDITION: delete the schema instead).
//   - A committed revision must be compatible with the current one
//     (schema.Compatible).
//   - GetSchema defaults to the FULL view, the List methods to BASIC (no
//     definition). GetSchema of name@rev returns that name; revisions are
//     listed newest first, named name@rev.
//   - A topic validates against every revision in [first, last] by creation
//     order, even after one of the bounds is deleted: the record keeps the
//     position of deleted revisions for that.
//   - Publishing to a topic whose schema is deleted fails (NOT_FOUND, as
//     Google's emulator answers), also once a schema of the same name is
//     created again: the topic shows schema "_deleted-schema_".
//   - A published message carries the attributes googclient_schemaname,
//     googclient_schemaencoding and googclient_schemarevisionid (the
//     revision it validated against), as the service sets them.
const (
	schemasBucket = "JO_SCHEMAS"

	// DeletedSchema is the name the service shows in a topic's
	// schema_settings.schema once the schema is deleted.
	DeletedSchema = "_deleted-schema_"

	maxRevisions  = 20   // per schema, "at a time"
	maxTombstones = 1000 // positions of deleted revisions kept per schema

	// recordTTL bounds how long ValidateForTopic trusts a schema record it
	// read, so that publishing does not read the bucket for every message.
	// Changes made through this server are seen at once; changes made
	// through another sidecar within recordTTL.
	recordTTL = time.Second

	maxCached = 10000 // records and compiled revisions kept in memory, each

	schemaTimeout = 10 * time.Second // of bucket operations whose ctx has no deadline
)

// Server implements pb.SchemaServiceServer over a JetStream key-value
// bucket (JO_SCHEMAS), one JSON record per schema holding every revision;
// updates are compare-and-set on the record's revision, so sidecars sharing
// the bucket can change schemas concurrently. It is safe for concurrent
// use. It starts no goroutines and holds nothing to close.
type Server struct {
	pb.UnimplementedSchemaServiceServer

	js       jetstream.JetStream
	jsErr    error
	replicas int
	log      *slog.Logger

	kv grpcutil.LazyBucket

	mu       sync.Mutex                // guards the caches
	records  map[string]cachedRecord   // by schema name, for ValidateForTopic
	compiled map[string]*schema.Schema // by name@revision
}

var _ pb.SchemaServiceServer = (*Server)(nil)

type cachedRecord struct {
	rec   *schemaRecord // nil: the schema does not exist
	kvRev uint64
	at    time.Time
}

// New returns a Server over nc. The bucket is created, with
// file storage and the given replicas, on first use. log may be nil.
func New(nc *nats.Conn, replicas int, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var js jetstream.JetStream
	err := errors.New("no NATS connection")
	if nc != nil {
		js, err = jetstream.New(nc)
	}
	return &Server{
		js: js, jsErr: err, replicas: max(replicas, 1), log: log,
		kv: grpcutil.LazyBucket{Config: jetstream.KeyValueConfig{
			Bucket:      schemasBucket,
			Description: "jetorder Pub/Sub schemas, one record per schema with every revision",
			Storage:     jetstream.FileStorage,
			Replicas:    max(replicas, 1),
		}},
		records:  make(map[string]cachedRecord),
		compiled: make(map[string]*schema.Schema),
	}
}

// Register adds the SchemaService to g.
func (s *Server) Register(g *grpc.Server) {
	pb.RegisterSchemaServiceServer(g, s)
}

// The stored record.

// schemaRecord is a schema: its revisions, oldest first, and the positions
// of deleted ones.
type schemaRecord struct {
	// UID tells this schema from an earlier one of the same name that was
	// deleted: topics keep the UID of the schema they name (TopicSchema).
	// Records written before it was kept have none.
	UID       string           `json:"uid,omitempty"`
	Revisions []revisionRecord `json:"revisions"`
	Deleted   []tombstone      `json:"deleted,omitempty"`
	Seq       uint64           `json:"seq"` // of the last revision made
}

type revisionRecord struct {
	ID          string    `json:"id"`
	Seq         uint64    `json:"seq"` // creation order within the schema
	Created     time.Time `json:"created"`
	Type        string    `json:"type"` // pb.Schema_Type name
	Definition  string    `json:"definition,omitempty"`
	RootMessage string    `json:"root_message,omitempty"` // CompiledProtoSchema
	Compiled    []byte    `json:"compiled,omitempty"`
}

type tombstone struct {
	ID  string `json:"id"`
	Seq uint64 `json:"seq"`
}

func (r revisionRecord) schemaType() pb.Schema_Type {
	return pb.Schema_Type(pb.Schema_Type_value[r.Type])
}

func (r *schemaRecord) latest() revisionRecord { return r.Revisions[len(r.Revisions)-1] }

func (r *schemaRecord) find(id string) (revisionRecord, bool) {
	for _, rev := range r.Revisions {
		if rev.ID == id {
			return rev, true
		}
	}
	return revisionRecord{}, false
}

// seqOf is the position of a revision, deleted or not.
func (r *schemaRecord) seqOf(id string) (uint64, bool) {
	if rev, ok := r.find(id); ok {
		return rev.Seq, true
	}
	for _, t := range r.Deleted {
		if t.ID == id {
			return t.Seq, true
		}
	}
	return 0, false
}

// add appends rev as the newest revision, with a new id.
func (r *schemaRecord) add(rev revisionRecord) revisionRecord {
	for {
		rev.ID = newRevisionID()
		if _, taken := r.seqOf(rev.ID); !taken {
			break
		}
	}
	r.Seq++
	rev.Seq = r.Seq
	rev.Created = time.Now().UTC()
	r.Revisions = append(r.Revisions, rev)
	return rev
}

// allowed returns the revisions a topic validates against, newest first:
// those created from first to last (either empty: no bound). A bound that
// was deleted still bounds by its position; one never seen bounds nothing.
func (r *schemaRecord) allowed(first, last string) []revisionRecord {
	lo, hi := uint64(0), uint64(math.MaxUint64)
	if seq, ok := r.seqOf(first); first != "" && ok {
		lo = seq
	}
	if seq, ok := r.seqOf(last); last != "" && ok {
		hi = seq
	}
	var out []revisionRecord
	for i := len(r.Revisions) - 1; i >= 0; i-- {
		if rev := r.Revisions[i]; rev.Seq >= lo && rev.Seq <= hi {
			out = append(out, rev)
		}
	}
	return out
}

func newRevisionID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func newUID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// revisionProto is a revision as the API shows it under name.
func revisionProto(name string, rev revisionRecord, view pb.SchemaView) *pb.Schema {
	sc := &pb.Schema{
		Name:               name,
		Type:               rev.schemaType(),
		RevisionId:         rev.ID,
		RevisionCreateTime: timestamppb.New(rev.Created),
	}
	if view == pb.SchemaView_FULL {
		sc.Definition = rev.Definition
		if rev.RootMessage != "" {
			sc.Configuration = &pb.Schema_CompiledProtoSchema{CompiledProtoSchema: &pb.CompiledProtoSchema{
				RootMessage: rev.RootMessage, CompiledBytes: rev.Compiled,
			}}
		}
	}
	return sc
}

// Resource names.

// schemaRef is a parsed projects/{project}/schemas/{schema}[@{revision}].
type schemaRef struct{ project, id, rev string }

func (r schemaRef) name() string { return "projects/" + r.project + "/schemas/" + r.id }

func (r schemaRef) key() string { return escapeKey(r.project) + "." + escapeKey(r.id) }

type revMode int

const (
	revForbidden revMode = iota // the name of a schema, for methods that change it
	revAllowed                  // a schema, or one revision of it
	revRequired                 // one revision
)

func parseSchemaName(name string, mode revMode) (schemaRef, error) {
	base, rev, hasRev := strings.Cut(name, "@")
	parts := strings.Split(base, "/")
	if len(parts) != 4 || parts[0] != "projects" || parts[2] != "schemas" || parts[1] == "" || parts[3] == "" || (hasRev && rev == "") {
		return schemaRef{}, invalid("invalid schema name %q: want projects/{project}/schemas/{schema}", name)
	}
	if err := keyrouter.ValidateProjectID(parts[1]); err != nil {
		return schemaRef{}, invalid("invalid schema name %q: %v", name, err)
	}
	if err := validateSchemaID(parts[3]); err != nil {
		return schemaRef{}, err
	}
	switch {
	case mode == revForbidden && hasRev:
		return schemaRef{}, invalid("schema name %q names a revision: this method takes projects/{project}/schemas/{schema}", name)
	case mode == revRequired && !hasRev:
		return schemaRef{}, invalid("schema name %q names no revision: want projects/{project}/schemas/{schema}@{revision}", name)
	}
	return schemaRef{project: parts[1], id: parts[3], rev: rev}, nil
}

// validateSchemaID applies the rule of topic ids, which the service
// applies to every resource id.
func validateSchemaID(id string) error {
	if keyrouter.ValidateTopicID(id) != nil {
		return invalid("invalid schema id %q: it must be 3-255 characters, start with a letter, not start with \"goog\", "+
			"and contain only letters, digits and - _ . ~ + %%", id)
	}
	return nil
}

// escapeKey makes a project or schema id a key token: letters, digits, - and
// _ stay, every other byte becomes =XX.
func escapeKey(s string) string {
	var b strings.Builder
	for i := range len(s) {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "=%02X", c)
		}
	}
	return b.String()
}

func unescapeKey(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '=' && i+3 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// The bucket.

func withSchemaTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, schemaTimeout)
}

// bucket opens JO_SCHEMAS, creating it on first use.
func (s *Server) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	if s.jsErr != nil {
		return nil, grpcutil.Status(s.jsErr)
	}
	return s.kv.Open(ctx, s.js)
}

// load reads a schema's record; a missing schema is NOT_FOUND.
func (s *Server) load(ctx context.Context, ref schemaRef) (*schemaRecord, uint64, error) {
	kv, err := s.bucket(ctx)
	if err != nil {
		return nil, 0, err
	}
	e, err := kv.Get(ctx, ref.key())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		s.remember(ref.name(), nil, 0)
		return nil, 0, status.Errorf(codes.NotFound, "schema %s not found", ref.name())
	}
	if err != nil {
		return nil, 0, grpcutil.Status(err)
	}
	rec, err := decodeRecord(e.Value())
	if err != nil {
		return nil, 0, status.Errorf(codes.Internal, "schema %s: %v", ref.name(), err)
	}
	s.remember(ref.name(), rec, e.Revision())
	return rec, e.Revision(), nil
}

func decodeRecord(data []byte) (*schemaRecord, error) {
	var rec schemaRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("undecodable record: %w", err)
	}
	if len(rec.Revisions) == 0 {
		return nil, errors.New("record without revisions")
	}
	return &rec, nil
}

// update changes a schema's record with f, compare-and-set: if another
// writer got in first, it reads the record again and calls f again, until
// ctx ends. f returns a status to refuse the change.
func (s *Server) update(ctx context.Context, ref schemaRef, f func(*schemaRecord) error) (*schemaRecord, error) {
	kv, err := s.bucket(ctx)
	if err != nil {
		return nil, err
	}
	for {
		rec, kvRev, err := s.load(ctx, ref)
		if err != nil {
			return nil, err
		}
		if err := f(rec); err != nil {
			return nil, err
		}
		data, err := json.Marshal(rec)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "schema %s: %v", ref.name(), err)
		}
		newRev, err := kv.Update(ctx, ref.key(), data, kvRev)
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			if ctx.Err() != nil {
				return nil, grpcutil.Status(ctx.Err())
			}
			continue // changed since we read it
		}
		if err != nil {
			return nil, grpcutil.Status(err)
		}
		s.remember(ref.name(), rec, newRev)
		return rec, nil
	}
}

// remember caches what the bucket holds for a schema at kvRev.
func (s *Server) remember(name string, rec *schemaRecord, kvRev uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.records[name]; ok && old.kvRev > kvRev && kvRev != 0 {
		return // a newer one is cached already
	}
	if len(s.records) >= maxCached {
		clear(s.records)
	}
	s.records[name] = cachedRecord{rec: rec, kvRev: kvRev, at: time.Now()}
}

// forget drops what is cached of a deleted schema or revision ("" : all).
func (s *Server) forget(name, rev string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.compiled {
		if k == name+"@"+rev || rev == "" && strings.HasPrefix(k, name+"@") {
			delete(s.compiled, k)
		}
	}
}

// cachedLoad is load through the cache, for the publish path.
func (s *Server) cachedLoad(ctx context.Context, ref schemaRef) (*schemaRecord, error) {
	s.mu.Lock()
	c, ok := s.records[ref.name()]
	s.mu.Unlock()
	if ok && time.Since(c.at) < recordTTL {
		if c.rec == nil {
			return nil, status.Errorf(codes.NotFound, "schema %s not found", ref.name())
		}
		return c.rec, nil
	}
	rec, _, err := s.load(ctx, ref)
	return rec, err
}

// compile returns a revision's compiled schema, cached by name@revision
// (revisions never change).
func (s *Server) compile(name string, rev revisionRecord) (*schema.Schema, error) {
	key := name + "@" + rev.ID
	s.mu.Lock()
	c := s.compiled[key]
	s.mu.Unlock()
	if c != nil {
		return c, nil
	}
	c, err := compileRevision(rev)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "schema %s: stored revision does not compile: %v", key, err)
	}
	s.mu.Lock()
	if len(s.compiled) >= maxCached {
		clear(s.compiled)
	}
	s.compiled[key] = c
	s.mu.Unlock()
	return c, nil
}

func compileRevision(rev revisionRecord) (*schema.Schema, error) {
	if rev.RootMessage != "" {
		return schema.CompileDescriptorSet(rev.Compiled, rev.RootMessage)
	}
	return schema.Compile(rev.schemaType(), rev.Definition)
}

// newRevision checks a schema given in a request and returns it as a
// revision (without id and time) and compiled; an invalid schema is
// INVALID_ARGUMENT.
func newRevision(sc *pb.Schema) (revisionRecord, *schema.Schema, error) {
	if sc == nil {
		return revisionRecord{}, nil, invalid("schema is required")
	}
	rev := revisionRecord{Type: sc.GetType().String(), Definition: sc.GetDefinition()}
	if cfg := sc.GetCompiledProtoSchema(); cfg != nil {
		switch {
		case sc.GetDefinition() != "":
			return revisionRecord{}, nil, invalid("schema: definition and compiled_proto_schema are mutually exclusive")
		case sc.GetType() != pb.Schema_PROTOCOL_BUFFER:
			return revisionRecord{}, nil, invalid("schema: compiled_proto_schema needs type PROTOCOL_BUFFER, not %v", sc.GetType())
		case len(cfg.GetCompiledBytes()) > schema.MaxDefinitionSize:
			return revisionRecord{}, nil, invalid("schema: compiled_bytes is %d bytes, over the limit of %d", len(cfg.GetCompiledBytes()), schema.MaxDefinitionSize)
		}
		rev.RootMessage, rev.Compiled = cfg.GetRootMessage(), cfg.GetCompiledBytes()
	}
	c, err := compileRevision(rev)
	if err != nil {
		return revisionRecord{}, nil, invalid("%v", err)
	}
	return rev, c, nil
}

// The SchemaService.

// CreateSchema creates a schema with its first revision.
func (s *Server) CreateSchema(ctx context.Context, req *pb.CreateSchemaRequest) (*pb.Schema, error) {
	ctx, cancel := withSchemaTimeout(ctx)
	defer cancel()
	project, err := grpcutil.ParseProject(req.GetParent())
	if err != nil {
		return nil, err
	}
	if req.GetSchemaId() == "" {
		return nil, invalid("schema_id is required")
	}
	if err := validateSchemaID(req.GetSchemaId()); err != nil {
		return nil, err
	}
	ref := schemaRef{project: project, id: req.GetSchemaId()}
	rev, compiled, err := newRevision(req.GetSchema())
	if err != nil {
		return nil, err
	}
	rec := schemaRecord{UID: newUID()}
	rev = rec.add(rev)
	data, err := json.Marshal(&rec)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "schema %s: %v", ref.name(), err)
	}
	kv, err := s.bucket(ctx)
	if err != nil {
		return nil, err
	}
	kvRev, err := kv.Create(ctx, ref.key(), data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return nil, status.Errorf(codes.AlreadyExists, "schema %s already exists", ref.name())
	}
	if err != nil {
		return nil, grpcutil.Status(err)
	}
	s.remember(ref.name(), &rec, kvRev)
	s.forget(ref.name(), "") // of an earlier schema of the same name
	s.keepCompiled(ref.name(), rev.ID, compiled)
	return revisionProto(ref.name(), rev, pb.SchemaView_FULL), nil
}

func (s *Server) keepCompiled(name, rev string, c *schema.Schema) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.compiled) >= maxCached {
		clear(s.compiled)
	}
	s.compiled[name+"@"+rev] = c
}

// GetSchema returns a schema's newest revision, or the revision named by
// name@revision, under the name asked for. The default view is FULL.
func (s *Server) GetSchema(ctx context.Context, req *pb.GetSchemaRequest) (*pb.Schema, error) {
	ctx, cancel := withSchemaTimeout(ctx)
	defer cancel()
	ref, err := parseSchemaName(req.GetName(), revAllowed)
	if err != nil {
		return nil, err
	}
	rec, _, err := s.load(ctx, ref)
	if err != nil {
		return nil, err
	}
	rev, err := revisionOf(rec, ref)
	if err != nil {
		return nil, err
	}
	return revisionProto(req.GetName(), rev, viewOr(req.GetView(), pb.SchemaView_FULL)), nil
}

// viewOr is view, or def when the request leaves it unspecified.
func viewOr(view, def pb.SchemaView) pb.SchemaView {
	if view == pb.SchemaView_SCHEMA_VIEW_UNSPECIFIED {
		return def
	}
	return view
}

// revisionOf is the revision a reference names: the newest if none.
func revisionOf(rec *schemaRecord, ref schemaRef) (revisionRecord, error) {
	if ref.rev == "" {
		return rec.latest(), nil
	}
	rev, ok := rec.find(ref.rev)
	if !ok {
		return revisionRecord{}, status.Errorf(codes.NotFound, "revision %s of schema %s not found", ref.rev, ref.name())
	}
	return rev, nil
}

// ListSchemas lists a project's schemas by name, each at its newest
// revision. The default view is BASIC.
func (s *Server) ListSchemas(ctx context.Context, req *pb.ListSchemasRequest) (*pb.ListSchemasResponse, error) {
	ctx, cancel := withSchemaTimeout(ctx)
	defer cancel()
	project, err := grpcutil.ParseProject(req.GetParent())
	if err != nil {
		return nil, err
	}
	kv, err := s.bucket(ctx)
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeysFiltered(ctx, escapeKey(project)+".>")
	if err != nil {
		return nil, grpcutil.Status(err)
	}
	var refs []schemaRef
	seen := map[string]bool{}
	for k := range lister.Keys() {
		if seen[k] {
			continue // the lister may repeat keys written while it runs
		}
		seen[k] = true
		_, id, _ := strings.Cut(k, ".")
		refs = append(refs, schemaRef{project: project, id: unescapeKey(id)})
	}
	if ctx.Err() != nil {
		return nil, grpcutil.Status(ctx.Err()) // the list was cut short
	}
	sort.Slice(refs, func(i, j int) bool { return refs[i].name() < refs[j].name() })
	refs, next, err := grpcutil.Page(refs, schemaRef.name, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	view := viewOr(req.GetView(), pb.SchemaView_BASIC) // the lists' default
	resp := &pb.ListSchemasResponse{NextPageToken: next}
	for _, ref := range refs {
		rec, _, err := s.load(ctx, ref)
		if status.Code(err) == codes.NotFound {
			continue // deleted since listed
		}
		if err != nil {
			return nil, err
		}
		resp.Schemas = append(resp.Schemas, revisionProto(ref.name(), rec.latest(), view))
	}
	return resp, nil
}

// ListSchemaRevisions lists a schema's revisions newest first, each named
// name@revision. The default view is BASIC. The page token is the position
// of the last revision of the previous page.
func (s *Server) ListSchemaRevisions(ctx context.Context, req *pb.ListSchemaRevisionsRequest) (*pb.ListSchemaRevisionsResponse, error) {
	ctx, cancel := withSchemaTimeout(ctx)
	defer cancel()
	ref, err := parseSchemaName(req.GetName(), revForbidden)
	if err != nil {
		return nil, err
	}
	if req.GetPageSize() < 0 {
		return nil, invalid("page_size %d is negative", req.GetPageSize())
	}
	before := uint64(math.MaxUint64)
	if tok := req.GetPageToken(); tok != "" {
		if before, err = strconv.ParseUint(tok, 10, 64); err != nil {
			return nil, invalid("invalid page_token %q", tok)
		}
	}
	rec, _, err := s.load(ctx, ref)
	if err != nil {
		return nil, err
	}
	view := viewOr(req.GetView(), pb.SchemaView_BASIC) // the lists' default
	resp := &pb.ListSchemaRevisionsResponse{}
	for i := len(rec.Revisions) - 1; i >= 0; i-- {
		rev := rec.Revisions[i]
		if rev.Seq >= before {
			continue
		}
		if n := req.GetPageSize(); n > 0 && len(resp.Schemas) == int(n) {
			resp.NextPageToken = strconv.FormatUint(rec.Revisions[i+1].Seq, 10)
			break
		}
		resp.Schemas = append(resp.Schemas, revisionProto(ref.name()+"@"+rev.ID, rev, view))
	}
	return resp, nil
}

// CommitSchema adds a revision, which must be compatible with the newest.
func (s *Server) CommitSchema(ctx context.Context, req *pb.CommitSchemaRequest) (*pb.Schema, error) {
	ctx, cancel := withSchemaTimeout(ctx)
	defer cancel()
	ref, err := parseSchemaName(req.GetName(), revForbidden)
	if err != nil {
		return nil, err
	}
	rev, compiled, err := newRevision(req.GetSchema())
	if err != nil {
		return nil, err
	}
	var added revisionRecord
	_, err = s.update(ctx, ref, func(rec *schemaRecord) error {
		if err := roomForRevision(rec, ref); err != nil {
			return err
		}
		cur, err := s.compile(ref.name(), rec.latest())
		if err != nil {
			return err
		}
		if err := schema.Compatible(cur, compiled); err != nil {
			return invalid("%v (current revision %s)", err, rec.latest().ID)
		}
		added = rec.add(rev)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.keepCompiled(ref.name(), added.ID, compiled)
	return revisionProto(ref.name(), added, pb.SchemaView_FULL), nil
}

func roomForRevision(rec *schemaRecord, ref schemaRef) error {
	if len(rec.Revisions) >= maxRevisions {
		return status.Errorf(codes.ResourceExhausted, "schema %s has %d revisions, the most a schema can have: delete one first", ref.name(), maxRevisions)
	}
	return nil
}

// RollbackSchema adds a revision with the definition of an earlier one.
func (s *Server) RollbackSchema(ctx context.Context, req *pb.RollbackSchemaRequest) (*pb.Schema, error) {
	ctx, cancel := withSchemaTimeout(ctx)
	defer cancel()
	ref, err := parseSchemaName(req.GetName(), revForbidden)
	if err != nil {
		return nil, err
	}
	if req.GetRevisionId() == "" {
		return nil, invalid("revision_id is required")
	}
	var added revisionRecord
	_, err = s.update(ctx, ref, func(rec *schemaRecord) error {
		old, ok := rec.find(req.GetRevisionId())
		if !ok {
			return status.Errorf(codes.NotFound, "revision %s of schema %s not found", req.GetRevisionId(), ref.name())
		}
		if err := roomForRevision(rec, ref); err != nil {
			return err
		}
		added = rec.add(old)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return revisionProto(ref.name(), added, pb.SchemaView_FULL), nil
}

// DeleteSchemaRevision deletes name@revision and returns the revision
// deleted, as Google's emulator does (the service does not say which it
// returns). The only revision cannot be deleted: INVALID_ARGUMENT, as the
// emulator answers.
func (s *Server) DeleteSchemaRevision(ctx context.Context, req *pb.DeleteSchemaRevisionRequest) (*pb.Schema, error) {
	ctx, cancel := withSchemaTimeout(ctx)
	defer cancel()
	name := req.GetName()
	// The deprecated revision_id field still names the revision when the
	// name does not.
	if id := req.GetRevisionId(); id != "" && !strings.Contains(name, "@") {
		name += "@" + id
	}
	ref, err := parseSchemaName(name, revRequired)
	if err != nil {
		return nil, err
	}
	var deleted revisionRecord
	_, err = s.update(ctx, ref, func(rec *schemaRecord) error {
		i := slices.IndexFunc(rec.Revisions, func(r revisionRecord) bool { return r.ID == ref.rev })
		if i < 0 {
			return status.Errorf(codes.NotFound, "revision %s of schema %s not found", ref.rev, ref.name())
		}
		if len(rec.Revisions) == 1 {
			return status.Errorf(codes.InvalidArgument, "revision %s is the last one of schema %s: cannot delete the last revision, delete the schema instead", ref.rev, ref.name())
		}
		deleted = rec.Revisions[i]
		rec.Deleted = append(rec.Deleted, tombstone{ID: ref.rev, Seq: rec.Revisions[i].Seq})
		if len(rec.Deleted) > maxTombstones {
			rec.Deleted = rec.Deleted[len(rec.Deleted)-maxTombstones:]
		}
		rec.Revisions = slices.Delete(rec.Revisions, i, i+1)
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.forget(ref.name(), ref.rev)
	return revisionProto(ref.name(), deleted, pb.SchemaView_FULL), nil
}

// DeleteSchema deletes a schema with every revision. Topics that name it
// refuse messages from then on (Validator).
func (s *Server) DeleteSchema(ctx context.Context, req *pb.DeleteSchemaRequest) (*emptypb.Empty, error) {
	ctx, cancel := withSchemaTimeout(ctx)
	defer cancel()
	ref, err := parseSchemaName(req.GetName(), revForbidden)
	if err != nil {
		return nil, err
	}
	kv, err := s.bucket(ctx)
	if err != nil {
		return nil, err
	}
	for {
		_, kvRev, err := s.load(ctx, ref)
		if err != nil {
			return nil, err
		}
		err = kv.Delete(ctx, ref.key(), jetstream.LastRevision(kvRev))
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			if ctx.Err() != nil {
				return nil, grpcutil.Status(ctx.Err())
			}
			continue // changed since we read it
		}
		if err != nil {
			return nil, grpcutil.Status(err)
		}
		s.remember(ref.name(), nil, kvRev+1)
		s.forget(ref.name(), "")
		return &emptypb.Empty{}, nil
	}
}

// ValidateSchema checks a schema definition as CreateSchema does.
func (s *Server) ValidateSchema(_ context.Context, req *pb.ValidateSchemaRequest) (*pb.ValidateSchemaResponse, error) {
	if _, err := grpcutil.ParseProject(req.GetParent()); err != nil {
		return nil, err
	}
	if _, _, err := newRevision(req.GetSchema()); err != nil {
		return nil, err
	}
	return &pb.ValidateSchemaResponse{}, nil
}

// ValidateMessage checks a message against a stored schema (its newest
// revision, or name@revision) or one given inline.
func (s *Server) ValidateMessage(ctx context.Context, req *pb.ValidateMessageRequest) (*pb.ValidateMessageResponse, error) {
	ctx, cancel := withSchemaTimeout(ctx)
	defer cancel()
	if _, err := grpcutil.ParseProject(req.GetParent()); err != nil {
		return nil, err
	}
	if req.GetEncoding() == pb.Encoding_ENCODING_UNSPECIFIED {
		return nil, invalid("encoding is required: JSON or BINARY")
	}
	var c *schema.Schema
	switch spec := req.GetSchemaSpec().(type) {
	case *pb.ValidateMessageRequest_Name:
		ref, err := parseSchemaName(spec.Name, revAllowed)
		if err != nil {
			return nil, err
		}
		rec, _, err := s.load(ctx, ref)
		if err != nil {
			return nil, err
		}
		rev, err := revisionOf(rec, ref)
		if err != nil {
			return nil, err
		}
		if c, err = s.compile(ref.name(), rev); err != nil {
			return nil, err
		}
	case *pb.ValidateMessageRequest_Schema:
		var err error
		if _, c, err = newRevision(spec.Schema); err != nil {
			return nil, err
		}
	default:
		return nil, invalid("one of name and schema is required")
	}
	if err := c.Validate(req.GetEncoding(), req.GetMessage()); err != nil {
		// The service's words, then the decoder's reason.
		return nil, invalid("Invalid data in message: %s", invalidReason(err))
	}
	return &pb.ValidateMessageResponse{}, nil
}

// The topic side.

// TopicSchema is a topic's schema settings as the topic keeps them (JSON
// in its service settings, docs/WIRE.md): the settings CheckSettings
// accepted, and the UID of the schema they were checked against, so that
// a schema deleted and then created again under the same name is not
// taken for the one the topic named.
type TopicSchema struct {
	Schema          string `json:"schema"`
	Encoding        string `json:"encoding"` // JSON or BINARY
	FirstRevisionID string `json:"firstRevisionId,omitempty"`
	LastRevisionID  string `json:"lastRevisionId,omitempty"`
	SchemaUID       string `json:"schemaUid,omitempty"`
}

func (ts *TopicSchema) encoding() pb.Encoding {
	return pb.Encoding(pb.Encoding_value[ts.Encoding])
}

// errSchemaDeleted is Publish's answer on a topic whose schema was
// deleted. The service documents only that publishing fails; this is the
// answer of Google's own emulator.
var errSchemaDeleted = status.Error(codes.NotFound, "Schema associated with topic deleted.")

// CheckSettings checks the schema settings of a topic being created or
// updated and returns them as the topic keeps them: the schema exists
// (NOT_FOUND otherwise), the encoding is JSON or BINARY, and the revision
// bounds, if given, are revisions of it (NOT_FOUND) with first created no
// later than last (INVALID_ARGUMENT). nil settings, a topic without schema,
// return nil. Errors are gRPC statuses. It reads the bucket, so it blocks
// up to ctx's deadline (10s if none). It is safe for concurrent use.
func (s *Server) CheckSettings(ctx context.Context, settings *pb.SchemaSettings) (*TopicSchema, error) {
	if settings == nil {
		return nil, nil
	}
	ctx, cancel := withSchemaTimeout(ctx)
	defer cancel()
	if settings.GetSchema() == "" {
		return nil, invalid("schema_settings.schema is required")
	}
	if settings.GetSchema() == DeletedSchema {
		return nil, invalid("schema_settings.schema %q names a deleted schema: name an existing one, or clear the schema settings", DeletedSchema)
	}
	ref, err := parseSchemaName(settings.GetSchema(), revForbidden)
	if err != nil {
		return nil, err
	}
	if e := settings.GetEncoding(); e != pb.Encoding_JSON && e != pb.Encoding_BINARY {
		return nil, invalid("schema_settings.encoding must be JSON or BINARY, not %v", e)
	}
	rec, _, err := s.load(ctx, ref)
	if err != nil {
		return nil, err
	}
	var seqs [2]uint64
	for i, id := range []string{settings.GetFirstRevisionId(), settings.GetLastRevisionId()} {
		if id == "" {
			continue
		}
		rev, ok := rec.find(id)
		if !ok {
			return nil, status.Errorf(codes.NotFound, "revision %s of schema %s not found", id, ref.name())
		}
		seqs[i] = rev.Seq
	}
	if seqs[0] != 0 && seqs[1] != 0 && seqs[0] > seqs[1] {
		return nil, invalid("schema_settings.first_revision_id %s was created after last_revision_id %s",
			settings.GetFirstRevisionId(), settings.GetLastRevisionId())
	}
	return &TopicSchema{
		Schema:          ref.name(),
		Encoding:        settings.GetEncoding().String(),
		FirstRevisionID: settings.GetFirstRevisionId(),
		LastRevisionID:  settings.GetLastRevisionId(),
		SchemaUID:       rec.UID,
	}, nil
}

// topicRecord returns the record of the schema a topic names, through the
// cache, or errSchemaDeleted if that schema is gone.
func (s *Server) topicRecord(ctx context.Context, ts *TopicSchema) (schemaRef, *schemaRecord, error) {
	ref, err := parseSchemaName(ts.Schema, revForbidden)
	if err != nil {
		return schemaRef{}, nil, errSchemaDeleted // _deleted-schema_, or a name no schema can have
	}
	rec, err := s.cachedLoad(ctx, ref)
	switch {
	case status.Code(err) == codes.NotFound:
		return schemaRef{}, nil, errSchemaDeleted
	case err != nil:
		return schemaRef{}, nil, err
	case rec.UID != ts.SchemaUID:
		return schemaRef{}, nil, errSchemaDeleted // and another created under its name
	}
	return ref, rec, nil
}

// SettingsOf returns a topic's schema settings as GetTopic shows them:
// as they were set, with schema "_deleted-schema_" once the schema is
// deleted. nil ts returns nil. It reads the schema through the cache
// (blocking up to ctx's deadline, 10s if none, on a miss), so a deletion
// through another server shows within recordTTL.
func (s *Server) SettingsOf(ctx context.Context, ts *TopicSchema) (*pb.SchemaSettings, error) {
	if ts == nil {
		return nil, nil
	}
	out := &pb.SchemaSettings{
		Schema:          ts.Schema,
		Encoding:        ts.encoding(),
		FirstRevisionId: ts.FirstRevisionID,
		LastRevisionId:  ts.LastRevisionID,
	}
	ctx, cancel := withSchemaTimeout(ctx)
	defer cancel()
	_, _, err := s.topicRecord(ctx, ts)
	if errors.Is(err, errSchemaDeleted) {
		out.Schema = DeletedSchema
		err = nil
	}
	return out, err
}

// TopicValidator checks the messages of one Publish request against a
// topic's schema settings, all against the same revisions. It is not safe
// for concurrent use.
type TopicValidator struct {
	ref      schemaRef
	enc      pb.Encoding
	typ      pb.Schema_Type
	revs     []revisionRecord // the allowed ones, newest first
	compiled []*schema.Schema // of revs
	settings *TopicSchema
}

// Validator returns a validator of messages for a topic with schema
// settings ts: the allowed revisions of the schema (from first_revision_id
// to last_revision_id, all if unset; a bound that was deleted still bounds
// by its position), compiled. On a topic whose schema was deleted it
// returns NOT_FOUND "Schema associated with topic deleted."; nil ts
// returns nil, which accepts everything. Schema records are cached for up
// to recordTTL and compiled revisions for good, so that most calls read
// nothing; a miss blocks on the bucket up to ctx's deadline (10s if none).
func (s *Server) Validator(ctx context.Context, ts *TopicSchema) (*TopicValidator, error) {
	if ts == nil {
		return nil, nil
	}
	ctx, cancel := withSchemaTimeout(ctx)
	defer cancel()
	ref, rec, err := s.topicRecord(ctx, ts)
	if err != nil {
		return nil, err
	}
	enc := ts.encoding()
	if enc != pb.Encoding_JSON && enc != pb.Encoding_BINARY {
		return nil, status.Errorf(codes.FailedPrecondition, "the schema settings of the topic have no encoding: set them again")
	}
	v := &TopicValidator{ref: ref, enc: enc, typ: rec.latest().schemaType(), revs: rec.allowed(ts.FirstRevisionID, ts.LastRevisionID), settings: ts}
	for _, rev := range v.revs {
		c, err := s.compile(ref.name(), rev)
		if err != nil {
			return nil, err
		}
		v.compiled = append(v.compiled, c)
	}
	return v, nil
}

// Validate checks one message's data and returns the id of the revision
// it is valid against, the newest that accepts it. what names the message
// in the error ("messages[3]"). An invalid message is INVALID_ARGUMENT
// "Invalid data in message: Message failed schema validation.", as the
// service answers, followed by why, with an ErrorInfo (domain
// pubsub.googleapis.com, reason INVALID_{JSON,BINARY}_{AVRO,PROTO}_MESSAGE,
// metadata revisionInfo in the service's words).
func (v *TopicValidator) Validate(data []byte, what string) (string, error) {
	if len(v.revs) == 0 {
		// Every revision of the range was deleted: nothing validates.
		return "", invalidMessage(v.enc, v.typ,
			fmt.Sprintf("no revision of schema %s from %q to %q remains", v.ref.name(), v.settings.FirstRevisionID, v.settings.LastRevisionID),
			fmt.Sprintf("%s cannot be validated: every revision of schema %s from %q to %q was deleted",
				what, v.ref.name(), v.settings.FirstRevisionID, v.settings.LastRevisionID))
	}
	var first, last error
	for i, c := range v.compiled {
		if last = c.Validate(v.enc, data); last == nil {
			return v.revs[i].ID, nil
		}
		if first == nil {
			first = last
		}
	}
	newest, oldest := v.revs[0], v.revs[len(v.revs)-1]
	tried := ""
	if n := len(v.revs); n > 1 {
		tried = fmt.Sprintf(" and %d older", n-1)
	}
	return "", invalidMessage(v.enc, v.typ,
		fmt.Sprintf("Could not validate message with any schema revision for schema: %s, last checked revision: revision_id=%s failed with status: %v",
			v.ref.name(), oldest.ID, last),
		fmt.Sprintf("%s is not valid against schema %s (revision %s%s): %s",
			what, v.ref.name(), newest.ID, tried, invalidReason(first)))
}

// invalidReason is a decoder's reason without the sentinel's words.
func invalidReason(err error) string {
	return strings.TrimPrefix(err.Error(), schema.ErrInvalidMessage.Error()+": ")
}

// ValidateForTopic checks one message's data against a topic's schema
// settings, as Publish does for each message of a request (Validator and
// Validate), and returns the id of the revision it is valid against. nil
// ts accepts everything.
func (s *Server) ValidateForTopic(ctx context.Context, ts *TopicSchema, data []byte) (string, error) {
	v, err := s.Validator(ctx, ts)
	if err != nil || v == nil {
		return "", err
	}
	return v.Validate(data, "the message")
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// invalidMessage is the service's status for a message its topic's schema
// refuses, with why (detail) after the service's words.
func invalidMessage(enc pb.Encoding, t pb.Schema_Type, revisionInfo, detail string) error {
	kind := "PROTO"
	if t == pb.Schema_AVRO {
		kind = "AVRO"
	}
	st := status.New(codes.InvalidArgument, "Invalid data in message: Message failed schema validation. "+detail)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason: fmt.Sprintf("INVALID_%s_%s_MESSAGE", strings.ToUpper(encodingWord(enc)), kind),
		Domain: "pubsub.googleapis.com",
		Metadata: map[string]string{
			"message":      "Message failed schema validation",
			"revisionInfo": revisionInfo,
		},
	}); err == nil {
		st = d
	}
	return st.Err()
}

func encodingWord(enc pb.Encoding) string {
	if enc == pb.Encoding_JSON {
		return "json"
	}
	return "binary"
}
