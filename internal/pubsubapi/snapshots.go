package pubsubapi

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/grpcutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// Snapshots and Seek.
//
// A snapshot is a point of a topic's stream: the first message its source
// subscription had not acked when it was taken (adapter FirstUnacked).
// Seeking a subscription to it makes every message before the point acked
// and every message from it on unacked. Snapshots are records of the KV
// bucket JO_SNAPSHOTS, one per snapshot (docs/WIRE.md). As the service,
// a snapshot lives 7 days minus the age of its subscription's oldest
// unacked message, and one that would live less than an hour is refused.

const (
	snapshotsBucket   = "JO_SNAPSHOTS"
	snapshotLife      = 7 * 24 * time.Hour
	minSnapshotLife   = time.Hour
	snapshotKeyPrefix = "s."
)

type snapshotRecord struct {
	Name         string            `json:"name"`               // projects/P/snapshots/S
	Topic        string            `json:"topic"`              // projects/P/topics/T
	Subscription string            `json:"subscription"`       // where it was taken
	Seq          uint64            `json:"seq"`                // first unacked message then
	KeySeqs      []uint64          `json:"key_seqs,omitempty"` // the same in each key stream (adapter.Point)
	Created      time.Time         `json:"created"`
	Expire       time.Time         `json:"expire"`
	Labels       map[string]string `json:"labels,omitempty"`
}

// snapshotStore keeps the snapshots in JO_SNAPSHOTS.
type snapshotStore struct {
	js jetstream.JetStream
	kv grpcutil.LazyBucket
}

func newSnapshotStore(js jetstream.JetStream, replicas int) snapshotStore {
	return snapshotStore{js: js, kv: grpcutil.LazyBucket{Config: jetstream.KeyValueConfig{
		Bucket:      snapshotsBucket,
		Description: "jetorder Pub/Sub snapshots: a point of a topic's stream each",
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}}}
}

func (st *snapshotStore) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	if st.js == nil {
		return nil, status.Error(codes.Unavailable, "no NATS connection")
	}
	return st.kv.Open(ctx, st.js)
}

func snapshotKey(project, id string) string { return snapshotKeyPrefix + keyrouter.KVKey(project, id) }

func parseSnapshot(name string) (project, id string, err error) {
	parts := strings.Split(name, "/")
	if len(parts) != 4 || parts[0] != "projects" || parts[2] != "snapshots" || parts[1] == "" || parts[3] == "" {
		return "", "", invalid("invalid snapshot name %q: want projects/{project}/snapshots/{snapshot}", name)
	}
	if err := keyrouter.ValidateProjectID(parts[1]); err != nil {
		return "", "", invalid("invalid snapshot name %q: %v", name, err)
	}
	// Snapshot ids follow the rules of topic and subscription ids.
	if err := keyrouter.ValidateSubscriptionID(parts[3]); err != nil {
		return "", "", invalid("invalid snapshot name %q: %v", name, err)
	}
	return parts[1], parts[3], nil
}

// load reads a snapshot that exists and has not expired.
func (st *snapshotStore) load(ctx context.Context, name string) (*snapshotRecord, jetstream.KeyValueEntry, error) {
	project, id, err := parseSnapshot(name)
	if err != nil {
		return nil, nil, err
	}
	kv, err := st.bucket(ctx)
	if err != nil {
		return nil, nil, err
	}
	e, err := kv.Get(ctx, snapshotKey(project, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil, status.Errorf(codes.NotFound, "snapshot %s not found", name)
	}
	if err != nil {
		return nil, nil, toStatus(err)
	}
	var rec snapshotRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return nil, nil, status.Errorf(codes.Internal, "snapshot %s: corrupt record: %v", name, err)
	}
	if time.Now().After(rec.Expire) {
		_ = kv.Delete(ctx, e.Key(), jetstream.LastRevision(e.Revision()))
		return nil, nil, status.Errorf(codes.NotFound, "snapshot %s not found (it expired at %s)", name, rec.Expire.Format(time.RFC3339))
	}
	return &rec, e, nil
}

func snapshotProto(name string, rec *snapshotRecord) *pb.Snapshot {
	return &pb.Snapshot{Name: name, Topic: rec.Topic, ExpireTime: timestamppb.New(rec.Expire), Labels: rec.Labels}
}

// CreateSnapshot takes a snapshot of a subscription's acked state. Without
// a name it is given one, in the subscription's project, as the service
// does ("the server will assign a random name"; Google's v1 Go client
// relies on it).
func (s *Server) CreateSnapshot(ctx context.Context, req *pb.CreateSnapshotRequest) (*pb.Snapshot, error) {
	if req.GetName() == "" {
		subProject, _, err := parseSubscription(req.GetSubscription())
		if err != nil {
			return nil, err
		}
		req = proto.CloneOf(req)
		req.Name = "projects/" + subProject + "/snapshots/snapshot-" + strings.ReplaceAll(uuid.NewString(), "-", "")
	}
	project, id, err := parseSnapshot(req.GetName())
	if err != nil {
		return nil, err
	}
	sub, err := s.subscriptionOf(req.GetSubscription())
	if err != nil {
		return nil, err
	}
	if err := checkLabels(req.GetLabels()); err != nil {
		return nil, err
	}
	cfg, err := sub.Config(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	if cfg.TopicDeleted {
		return nil, status.Errorf(codes.FailedPrecondition, "subscription %s: its topic was deleted", req.GetSubscription())
	}
	point, oldest, err := sub.FirstUnackedPoint(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	now := time.Now().UTC()
	if oldest.IsZero() || oldest.After(now) {
		oldest = now
	}
	rec := &snapshotRecord{
		Name: req.GetName(), Topic: cfg.Topic.String(), Subscription: req.GetSubscription(), Seq: point.Seq, KeySeqs: point.KeySeqs,
		Created: now, Expire: oldest.Add(snapshotLife).UTC(), Labels: maps.Clone(req.GetLabels()),
	}
	if rec.Expire.Sub(now) < minSnapshotLife {
		return nil, status.Errorf(codes.FailedPrecondition, "snapshot of %s would expire in %v: its oldest unacked message is older than 7 days less 1 hour",
			req.GetSubscription(), rec.Expire.Sub(now).Round(time.Second))
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, toStatus(err)
	}
	kv, err := s.snapshots.bucket(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := kv.Create(ctx, snapshotKey(project, id), data); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			// An expired one may hold the name: it goes, and this one
			// takes its place.
			if _, _, lerr := s.snapshots.load(ctx, req.GetName()); status.Code(lerr) == codes.NotFound {
				if _, err = kv.Create(ctx, snapshotKey(project, id), data); err == nil {
					return snapshotProto(req.GetName(), rec), nil
				}
			}
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %s already exists", req.GetName())
		}
		return nil, toStatus(err)
	}
	return snapshotProto(req.GetName(), rec), nil
}

// GetSnapshot returns a snapshot's configuration.
func (s *Server) GetSnapshot(ctx context.Context, req *pb.GetSnapshotRequest) (*pb.Snapshot, error) {
	rec, _, err := s.snapshots.load(ctx, req.GetSnapshot())
	if err != nil {
		return nil, err
	}
	return snapshotProto(req.GetSnapshot(), rec), nil
}

// UpdateSnapshot changes a snapshot's labels or expire_time (which can
// only come sooner: the snapshot's messages are kept no longer).
func (s *Server) UpdateSnapshot(ctx context.Context, req *pb.UpdateSnapshotRequest) (*pb.Snapshot, error) {
	in := req.GetSnapshot()
	paths := req.GetUpdateMask().GetPaths()
	if len(paths) == 0 {
		return nil, invalid("update %s: update_mask names no field", in.GetName())
	}
	for _, p := range paths {
		switch p {
		case "labels":
			if err := checkLabels(in.GetLabels()); err != nil {
				return nil, err
			}
		case "expire_time":
		default:
			return nil, invalid("update %s: field %q cannot be updated (labels and expire_time can)", in.GetName(), p)
		}
	}
	kv, err := s.snapshots.bucket(ctx)
	if err != nil {
		return nil, err
	}
	for {
		rec, e, err := s.snapshots.load(ctx, in.GetName())
		if err != nil {
			return nil, err
		}
		for _, p := range paths {
			switch p {
			case "labels":
				rec.Labels = maps.Clone(in.GetLabels())
			case "expire_time":
				t := in.GetExpireTime()
				if !t.IsValid() || t.AsTime().After(rec.Expire) || t.AsTime().Before(time.Now()) {
					return nil, invalid("update %s: expire_time must be between now and %s", in.GetName(), rec.Expire.Format(time.RFC3339))
				}
				rec.Expire = t.AsTime().UTC()
			}
		}
		data, err := json.Marshal(rec)
		if err != nil {
			return nil, toStatus(err)
		}
		if _, err := kv.Update(ctx, e.Key(), data, e.Revision()); err != nil {
			if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				continue // changed meanwhile
			}
			return nil, toStatus(err)
		}
		return snapshotProto(in.GetName(), rec), nil
	}
}

// ListSnapshots lists a project's snapshots, by name.
func (s *Server) ListSnapshots(ctx context.Context, req *pb.ListSnapshotsRequest) (*pb.ListSnapshotsResponse, error) {
	project, err := grpcutil.ParseProject(req.GetProject())
	if err != nil {
		return nil, err
	}
	kv, err := s.snapshots.bucket(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := kv.ListKeysFiltered(ctx, snapshotKeyPrefix+keyrouter.KVProjectFilter(project))
	if err != nil {
		return nil, toStatus(err)
	}
	var out []*pb.Snapshot
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, toStatus(err)
		}
		var rec snapshotRecord
		if json.Unmarshal(e.Value(), &rec) != nil || time.Now().After(rec.Expire) {
			continue // corrupt (GetSnapshot says so), or expired
		}
		out = append(out, snapshotProto(rec.Name, &rec))
	}
	slices.SortFunc(out, func(a, b *pb.Snapshot) int { return strings.Compare(a.GetName(), b.GetName()) })
	out, next, err := grpcutil.Page(out, (*pb.Snapshot).GetName, req.GetPageSize(), req.GetPageToken())
	if err != nil {
		return nil, err
	}
	return &pb.ListSnapshotsResponse{Snapshots: out, NextPageToken: next}, nil
}

// DeleteSnapshot deletes a snapshot; subscriptions sought to it keep their
// state.
func (s *Server) DeleteSnapshot(ctx context.Context, req *pb.DeleteSnapshotRequest) (*emptypb.Empty, error) {
	if _, _, err := s.snapshots.load(ctx, req.GetSnapshot()); err != nil {
		return nil, err
	}
	project, id, _ := parseSnapshot(req.GetSnapshot())
	kv, err := s.snapshots.bucket(ctx)
	if err != nil {
		return nil, err
	}
	if err := kv.Purge(ctx, snapshotKey(project, id)); err != nil {
		return nil, toStatus(err)
	}
	return &emptypb.Empty{}, nil
}

// Seek makes a subscription's messages before a time, or a snapshot's
// point, acked and those after it unacked. Receivers attached keep their
// messages until they are settled; the key's next message comes only
// after (adapter SeekToPoint).
func (s *Server) Seek(ctx context.Context, req *pb.SeekRequest) (*pb.SeekResponse, error) {
	sub, err := s.subscriptionOf(req.GetSubscription())
	if err != nil {
		return nil, err
	}
	switch target := req.GetTarget().(type) {
	case *pb.SeekRequest_Time:
		if !target.Time.IsValid() {
			return nil, invalid("seek %s: invalid time", req.GetSubscription())
		}
		err = sub.SeekToTime(ctx, target.Time.AsTime())
	case *pb.SeekRequest_Snapshot:
		rec, _, lerr := s.snapshots.load(ctx, target.Snapshot)
		if lerr != nil {
			return nil, lerr
		}
		cfg, cerr := sub.Config(ctx)
		if cerr != nil {
			return nil, toStatus(cerr)
		}
		if cfg.TopicDeleted || cfg.Topic.String() != rec.Topic {
			return nil, status.Errorf(codes.FailedPrecondition, "seek %s: snapshot %s is of topic %s, the subscription's is %s",
				req.GetSubscription(), target.Snapshot, rec.Topic, subscriptionTopic(cfg))
		}
		err = sub.SeekToPoint(ctx, adapter.Point{Seq: rec.Seq, KeySeqs: rec.KeySeqs})
	default:
		return nil, invalid("seek %s: set time or snapshot", req.GetSubscription())
	}
	if err != nil {
		return nil, toStatus(err)
	}
	s.activity.touch(req.GetSubscription())
	return &pb.SeekResponse{}, nil
}

// subscriptionTopic is the topic a subscription names: _deleted-topic_
// once its topic was deleted, as in the service.
func subscriptionTopic(cfg adapter.SubscriptionConfig) string {
	if cfg.TopicDeleted {
		return deletedTopic
	}
	return cfg.Topic.String()
}
