package resources

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/jetorder/jetorder/internal/pubsubapi"
)

// PubSub is the part of the Pub/Sub API that Apply reads and changes
// topics and subscriptions through; in the sidecar, its
// *pubsubapi.Server, called in process: what the file declares is checked
// as a client's request is, but no caller's access is (the sidecar
// applies the file itself). Methods are called one at a time, may block
// up to ctx's end, and return gRPC status errors.
type PubSub interface {
	GetTopic(context.Context, *pb.GetTopicRequest) (*pb.Topic, error)
	CreateTopic(context.Context, *pb.Topic) (*pb.Topic, error)
	UpdateTopic(context.Context, *pb.UpdateTopicRequest) (*pb.Topic, error)
	GetSubscription(context.Context, *pb.GetSubscriptionRequest) (*pb.Subscription, error)
	CreateSubscription(context.Context, *pb.Subscription) (*pb.Subscription, error)
	UpdateSubscription(context.Context, *pb.UpdateSubscriptionRequest) (*pb.Subscription, error)
}

// Schemas is the part of the SchemaService that Apply uses; in the
// sidecar, its *schemaapi.Server. As PubSub.
type Schemas interface {
	GetSchema(context.Context, *pb.GetSchemaRequest) (*pb.Schema, error)
	CreateSchema(context.Context, *pb.CreateSchemaRequest) (*pb.Schema, error)
}

// Outcome is what Apply did to one declared resource.
type Outcome struct {
	Name    string   // full resource name
	Created bool     // by this Apply (false when another created it first)
	Updated []string // the fields updated, as update_mask paths; none if unchanged
}

// Report lists what Apply did, one Outcome per resource it got to, in
// the order applied: schemas, topics, subscriptions.
type Report []Outcome

// Counts are the resources created, updated and left as they were.
func (r Report) Counts() (created, updated, unchanged int) {
	for _, o := range r {
		switch {
		case o.Created:
			created++
		case len(o.Updated) > 0:
			updated++
		default:
			unchanged++
		}
	}
	return created, updated, unchanged
}

// attempts bounds the reads, creates and updates of one resource that
// others keep changing under Apply (a create that lost a race and a
// resource gone again before it was read).
const attempts = 5

// Apply makes the resources the file declares exist with the settings it
// gives, in order: schemas, topics (whose schema settings name schemas),
// subscriptions (which name topics). A resource that does not exist is
// created with the declared settings; one that exists has each field the
// file gives compared, and those that differ are updated in one update
// (fields the file leaves out are left as they are). A create that finds
// the resource created meanwhile (AlreadyExists: another sidecar applying
// the same file) compares with what the other created, so that sidecars
// applying one file at once converge without errors. Nothing is deleted.
//
// First Apply reads every declared resource that exists and compares: if
// any differs in what no update can change (ErrFixed), it returns those
// problems and changes nothing. Then it creates and updates, going on past
// a resource the API refuses; what it did stays done. Every problem is an
// *Error naming the declaration's line; they are returned joined, with the
// report of what was done. Apply blocks until done or ctx ends.
func (f *File) Apply(ctx context.Context, ps PubSub, sc Schemas) (Report, error) {
	if _, err := f.pass(ctx, ps, sc, true); err != nil {
		return nil, err
	}
	return f.pass(ctx, ps, sc, false)
}

// pass applies every declaration, or with check only compares those that
// exist.
func (f *File) pass(ctx context.Context, ps PubSub, sc Schemas, check bool) (Report, error) {
	var r Report
	var errs []error
	note := func(o Outcome, err error) {
		if err != nil {
			errs = append(errs, err)
			return
		}
		r = append(r, o)
	}
	for _, s := range f.Schemas {
		note(f.schema(ctx, sc, s, check))
		if ctx.Err() != nil {
			return r, errors.Join(append(errs, ctx.Err())...)
		}
	}
	for _, t := range f.Topics {
		note(ensure(ctx, f, check, t.Decl, "topic", t.Topic.GetName(), t.Topic, pubsubapi.TopicCreationLabels(), nil,
			func(ctx context.Context) (*pb.Topic, error) {
				return ps.GetTopic(ctx, &pb.GetTopicRequest{Topic: t.Topic.GetName()})
			},
			func(ctx context.Context) error { _, err := ps.CreateTopic(ctx, proto.CloneOf(t.Topic)); return err },
			func(ctx context.Context, to *pb.Topic, mask []string) error {
				_, err := ps.UpdateTopic(ctx, &pb.UpdateTopicRequest{Topic: to, UpdateMask: &fieldmaskpb.FieldMask{Paths: mask}})
				return err
			}))
		if ctx.Err() != nil {
			return r, errors.Join(append(errs, ctx.Err())...)
		}
	}
	for _, s := range f.Subscriptions {
		note(ensure(ctx, f, check, s.Decl, "subscription", s.Subscription.GetName(), s.Subscription, pubsubapi.SubscriptionCreationLabels(), fixedSubscriptionFields,
			func(ctx context.Context) (*pb.Subscription, error) {
				return ps.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: s.Subscription.GetName()})
			},
			func(ctx context.Context) error {
				_, err := ps.CreateSubscription(ctx, proto.CloneOf(s.Subscription))
				return err
			},
			func(ctx context.Context, to *pb.Subscription, mask []string) error {
				_, err := ps.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{Subscription: to, UpdateMask: &fieldmaskpb.FieldMask{Paths: mask}})
				return err
			}))
		if ctx.Err() != nil {
			return r, errors.Join(append(errs, ctx.Err())...)
		}
	}
	return r, errors.Join(errs...)
}

// fixedSubscriptionFields cannot change after creation (UpdateSubscription
// refuses them, as the service does).
var fixedSubscriptionFields = []protoreflect.Name{"topic", "enable_message_ordering", "filter"}

// ensure applies the declaration d of a topic or subscription, want; with
// check it only compares an existing one (plan's errors).
func ensure[M proto.Message](ctx context.Context, f *File, check bool, d Decl, kind, name string, want M, creationLabels map[string]string,
	fixed []protoreflect.Name, get func(context.Context) (M, error), create func(context.Context) error,
	update func(context.Context, M, []string) error) (Outcome, error) {
	res := fmt.Sprintf("%s %q", kind, d.ID)
	fail := func(line int, op string, err error) (Outcome, error) {
		return Outcome{}, &Error{File: f.Path, Line: line, Resource: res, Op: op, Err: err}
	}
	o := Outcome{Name: name}
	for try := 1; ; try++ {
		last := try == attempts
		cur, err := get(ctx)
		if status.Code(err) == codes.NotFound {
			if check {
				return o, nil
			}
			err = create(ctx)
			if err == nil {
				o.Created = true
				return o, nil
			}
			if status.Code(err) == codes.AlreadyExists && !last {
				continue // created meanwhile: compare with that
			}
			return fail(d.Line, "create", err)
		}
		if err != nil {
			return fail(d.Line, "read", err)
		}
		to, mask, err := plan(f, d, kind, cur, want, creationLabels, fixed)
		if err != nil || check || len(mask) == 0 {
			return o, err
		}
		err = update(ctx, to, mask)
		if status.Code(err) == codes.NotFound && !last {
			continue // deleted meanwhile: a create that failed half-way went again
		}
		if err != nil {
			return fail(d.Line, "update", err)
		}
		o.Updated = mask
		return o, nil
	}
}

// plan compares the existing resource cur with the fields the file gives
// (d.given, their values in want): it returns cur with those fields set
// as the file says, and the top-level fields that then differ from cur,
// as update_mask paths. A differing field of fixed, or label of
// creationLabels, is refused (ErrFixed).
//
// A field given as a mapping sets only the fields given in it, the others
// kept from cur: an update then changes what the file says and nothing
// else, and settings the API fills in (a retry policy's maximum backoff,
// a dead-letter policy's attempts) compare equal when the file leaves them
// out.
func plan[M proto.Message](f *File, d Decl, kind string, cur, want M, creationLabels map[string]string, fixed []protoreflect.Name) (M, []string, error) {
	res := fmt.Sprintf("%s %q", kind, d.ID)
	to := proto.CloneOf(cur)
	src := proto.CloneOf(want).ProtoReflect()
	dst, old := to.ProtoReflect(), cur.ProtoReflect()
	var errs []error
	refuse := func(line int, format string, args ...any) {
		errs = append(errs, &Error{File: f.Path, Line: line, Resource: res, Err: ErrFixed, detail: fmt.Sprintf(format, args...)})
	}
	var mask []string
	for _, g := range d.given.fields {
		fd := g.fd
		if fd.Name() == "labels" && !g.null {
			labels, err := withCreationLabels(kind, old.Get(fd).Map(), src.Get(fd).Map(), creationLabels)
			if err != nil {
				refuse(g.line, "%v", err)
				continue
			}
			lm := src.Mutable(fd).Map()
			lm.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool { lm.Clear(k); return true })
			for k, v := range labels {
				lm.Set(protoreflect.ValueOfString(k).MapKey(), protoreflect.ValueOfString(v))
			}
		}
		mergeField(dst, src, g)
		if dst.Has(fd) == old.Has(fd) && dst.Get(fd).Equal(old.Get(fd)) {
			continue
		}
		if slices.Contains(fixed, fd.Name()) {
			refuse(g.line, "%s cannot change after creation: the %s has %s, the file %s",
				fd.JSONName(), kind, show(old, fd), show(dst, fd))
			continue
		}
		mask = append(mask, string(fd.Name()))
	}
	return to, mask, errors.Join(errs...)
}

// withCreationLabels returns the labels want with those of creation that
// want leaves out kept from cur; a creation label that want gives with
// another value than cur's is refused.
func withCreationLabels(kind string, cur, want protoreflect.Map, creation map[string]string) (map[string]string, error) {
	out := map[string]string{}
	want.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool { out[k.String()] = v.String(); return true })
	for _, label := range slices.Sorted(maps.Keys(creation)) {
		key := protoreflect.ValueOfString(label).MapKey()
		has := cur.Has(key)
		c := creation[label]
		if has {
			c = cur.Get(key).String()
		}
		w, given := out[label]
		switch {
		case !given:
			if has {
				out[label] = c
			}
		case w == c && has:
		case w == c && c != "":
			delete(out, label) // the value a resource without the label has
		default:
			shown := "none"
			if c != "" {
				shown = strconv.Quote(c)
			}
			return nil, fmt.Errorf("label %s is read only at creation: the %s has %s, the file %q", label, kind, shown, w)
		}
	}
	return out, nil
}

// merge sets in dst the fields that g gives, from src (mergeField).
func merge(dst, src protoreflect.Message, g *given) {
	for _, c := range g.fields {
		mergeField(dst, src, c)
	}
}

// mergeField sets field c of dst from src: a field given as a mapping
// field by field, one given as null cleared.
func mergeField(dst, src protoreflect.Message, c *given) {
	fd := c.fd
	switch {
	case c.null:
		dst.Clear(fd)
	case isGroup(fd):
		// Mutable makes it present (and, in a oneof, the one set).
		merge(dst.Mutable(fd).Message(), src.Get(fd).Message(), c)
	case src.Has(fd):
		dst.Set(fd, src.Get(fd))
	default:
		dst.Clear(fd)
	}
}

// isGroup reports whether fd is a message the file gives as a mapping of
// fields (not a duration).
func isGroup(fd protoreflect.FieldDescriptor) bool {
	return fd.Kind() == protoreflect.MessageKind && !fd.IsMap() && fd.Message().FullName() != "google.protobuf.Duration"
}

// show is field fd of m as the file would give it, for messages.
func show(m protoreflect.Message, fd protoreflect.FieldDescriptor) string {
	if fd.Kind() == protoreflect.StringKind {
		return strconv.Quote(m.Get(fd).String())
	}
	if fd.Kind() == protoreflect.MessageKind && !m.Has(fd) {
		return "none"
	}
	if fd.Kind() == protoreflect.MessageKind {
		b, _ := protojson.Marshal(m.Get(fd).Message().Interface())
		return string(b)
	}
	return m.Get(fd).String()
}

// schema applies a schema's declaration: created if missing; an existing
// one must have the declared type and definition at its newest revision
// (compared as text), which the file cannot change. With check it only
// compares an existing one.
func (f *File) schema(ctx context.Context, sc Schemas, s *Schema, check bool) (Outcome, error) {
	res := fmt.Sprintf("schema %q", s.ID)
	o := Outcome{Name: s.Schema.GetName()}
	fail := func(op string, err error) (Outcome, error) {
		return Outcome{}, &Error{File: f.Path, Line: s.Line, Resource: res, Op: op, Err: err}
	}
	for try := 1; ; try++ {
		cur, err := sc.GetSchema(ctx, &pb.GetSchemaRequest{Name: s.Schema.GetName(), View: pb.SchemaView_FULL})
		if status.Code(err) == codes.NotFound {
			if check {
				return o, nil
			}
			_, err = sc.CreateSchema(ctx, &pb.CreateSchemaRequest{
				Parent:   "projects/" + s.Project,
				SchemaId: s.ID,
				Schema:   &pb.Schema{Type: s.Schema.GetType(), Definition: s.Schema.GetDefinition()},
			})
			if err == nil {
				o.Created = true
				return o, nil
			}
			if status.Code(err) == codes.AlreadyExists && try < attempts {
				continue
			}
			return fail("create", err)
		}
		if err != nil {
			return fail("read", err)
		}
		var errs []error
		for _, g := range s.given.fields {
			var same bool
			switch g.fd.Name() {
			case "type":
				same = cur.GetType() == s.Schema.GetType()
			case "definition":
				same = cur.GetDefinition() == s.Schema.GetDefinition()
			}
			if !same {
				errs = append(errs, &Error{File: f.Path, Line: g.line, Resource: res, Err: ErrFixed, detail: fmt.Sprintf(
					"%s differs from the schema's newest revision (%s): the file cannot change it; commit a revision (CommitSchema) or delete the schema",
					g.fd.JSONName(), cur.GetRevisionId())})
			}
		}
		return o, errors.Join(errs...)
	}
}
