package iam

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// emptyEtag is the etag of a resource without a policy, as Google's
// service gives it ("ACAB" in base64).
var emptyEtag = []byte{0x00, 0x20, 0x01}

// etagOf is the etag of a policy stored at revision: the revision, which
// SetIamPolicy compares.
func etagOf(revision uint64) []byte {
	if revision == 0 {
		return emptyEtag
	}
	return binary.BigEndian.AppendUint64([]byte{0x07}, revision)
}

// revisionOf reads an etag back; ok is false for one this service never
// gave.
func revisionOf(etag []byte) (uint64, bool) {
	switch {
	case slices.Equal(etag, emptyEtag):
		return 0, true
	case len(etag) == 9 && etag[0] == 0x07:
		return binary.BigEndian.Uint64(etag[1:]), true
	}
	return 0, false
}

// Service is the google.iam.v1.IAMPolicy service for topics,
// subscriptions, snapshots and schemas. With access control (a Guard's
// Service) its calls are authorized before they reach it
// (UnaryInterceptor, or the REST routes) and the policies it keeps are
// enforced; without (OpenService) it keeps and returns them alike, and
// they enforce nothing. It is safe for concurrent use.
type Service struct {
	iampb.UnimplementedIAMPolicyServer
	policies policySource
	exists   func(context.Context, string) error
	audit    *slog.Logger
	guard    *Guard // nil: no access control, every caller may do everything
}

var _ iampb.IAMPolicyServer = (*Service)(nil)

// policySource gives a Service the store of the policies; it is called
// concurrently. create says whether a bucket that does not exist is
// created (to store a policy) or not (to read one, or drop one): then it
// gives nil and no error, as no resource has a policy. It may block until
// ctx ends while it opens the bucket.
type policySource interface {
	open(ctx context.Context, create bool) (*Store, error)
}

var (
	_ policySource = (*Store)(nil)
	_ policySource = (*LazyStore)(nil)
)

// open gives the store itself, opened before (nil: no store).
func (s *Store) open(context.Context, bool) (*Store, error) { return s, nil }

func (l *LazyStore) open(ctx context.Context, create bool) (*Store, error) {
	return l.Open(ctx, create)
}

// Service returns the guard's IAMPolicy service: the policies are the
// guard's, TestIamPermissions answers what the caller holds.
func (g *Guard) Service() *Service {
	return &Service{policies: g.store, exists: g.exists, audit: g.audit, guard: g}
}

// OpenService returns the IAMPolicy service of a sidecar without access
// control: it keeps the policies set in store and returns them as with
// access control, but nothing enforces them, and TestIamPermissions
// answers every Pub/Sub permission asked, since every caller may do
// everything. exists is as Config.Exists; log gets the policy changes, as
// the audit log with access control.
func OpenService(store *LazyStore, exists func(ctx context.Context, resource string) error, log *slog.Logger) *Service {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{policies: store, exists: exists, audit: log.With("audit", true)}
}

// Register adds the service to a gRPC server.
func (s *Service) Register(gs *grpc.Server) { iampb.RegisterIAMPolicyServer(gs, s) }

// checkResource refuses a name that is not a topic, subscription,
// snapshot or schema, and one that does not exist.
func (s *Service) checkResource(ctx context.Context, resource string) error {
	if KindOf(resource) == "" || iamPermission(resource, "x") == "pubsub.unknown.x" {
		return status.Errorf(codes.InvalidArgument, "Invalid resource name %q: want projects/P/topics/T, projects/P/subscriptions/S, projects/P/snapshots/S or projects/P/schemas/S", resource)
	}
	if s.exists != nil {
		return s.exists(ctx, resource)
	}
	return nil
}

// store opens the store for a call; its errors are statuses.
func (s *Service) store(ctx context.Context, create bool) (*Store, error) {
	st, err := s.policies.open(ctx, create)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read the policies: %v", err)
	}
	return st, nil
}

// GetIamPolicy returns a resource's own policy (not the project's).
func (s *Service) GetIamPolicy(ctx context.Context, req *iampb.GetIamPolicyRequest) (*iampb.Policy, error) {
	if v := req.GetOptions().GetRequestedPolicyVersion(); v < 0 || v > 3 {
		return nil, status.Errorf(codes.InvalidArgument, "Invalid requested policy version %d: want 0, 1 or 3", v)
	}
	if err := s.checkResource(ctx, req.GetResource()); err != nil {
		return nil, err
	}
	st, err := s.store(ctx, false)
	if err != nil {
		return nil, err
	}
	var pol *iampb.Policy
	var rev uint64
	if st != nil {
		pol, rev = st.Get(req.GetResource())
	}
	out := &iampb.Policy{Etag: etagOf(rev)}
	if pol != nil {
		out.Version = 1
		out.Bindings = pol.GetBindings()
	}
	return out, nil
}

// SetIamPolicy replaces a resource's policy. A policy with an etag
// replaces only the policy that etag was read from: otherwise ABORTED, as
// in Google's service, so read-modify-write cycles (gcloud's
// add-iam-policy-binding) lose no change.
func (s *Service) SetIamPolicy(ctx context.Context, req *iampb.SetIamPolicyRequest) (*iampb.Policy, error) {
	resource, pol := req.GetResource(), req.GetPolicy()
	if err := s.checkResource(ctx, resource); err != nil {
		return nil, err
	}
	if pol == nil {
		return nil, status.Error(codes.InvalidArgument, "Request contains an invalid argument: policy is required")
	}
	if v := pol.GetVersion(); v < 0 || v > 3 {
		return nil, status.Errorf(codes.InvalidArgument, "Invalid policy version %d: want 0, 1 or 3", v)
	}
	if len(pol.GetAuditConfigs()) > 0 {
		return nil, status.Error(codes.InvalidArgument, "auditConfigs are not supported")
	}
	if err := validateBindings(pol.GetBindings()); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "Invalid policy: %v", err)
	}
	st, err := s.store(ctx, true)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return nil, status.Error(codes.FailedPrecondition, "resource policies are not stored by this sidecar")
	}
	_, current := st.Get(resource)
	expect := current
	if len(pol.GetEtag()) > 0 {
		rev, ok := revisionOf(pol.GetEtag())
		if !ok || rev != current {
			return nil, concurrentChange()
		}
		expect = rev
	}
	stored := &iampb.Policy{Version: 1, Bindings: normalize(pol.GetBindings())}
	rev, err := st.Set(ctx, resource, stored, expect)
	if errors.Is(err, errConcurrentChange) {
		return nil, concurrentChange()
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "store the policy: %v", err)
	}
	s.audit.Info("policy changed", "principal", orAnonymous(CallerOf(ctx).Principal), "method", "SetIamPolicy",
		"resource", resource, "bindings", describeBindings(stored.GetBindings()))
	return &iampb.Policy{Version: 1, Bindings: stored.GetBindings(), Etag: etagOf(rev)}, nil
}

func concurrentChange() error {
	return status.Error(codes.Aborted, "There were concurrent policy changes. Please retry the whole read-modify-write with exponential backoff.")
}

// normalize merges the bindings of one role and sorts roles and members,
// as Google's service returns them; bindings left with no member go.
func normalize(bs []*iampb.Binding) []*iampb.Binding {
	byRole := map[string][]string{}
	for _, b := range bs {
		byRole[b.GetRole()] = append(byRole[b.GetRole()], b.GetMembers()...)
	}
	var out []*iampb.Binding
	for role, ms := range byRole {
		slices.Sort(ms)
		ms = slices.Compact(ms)
		out = append(out, &iampb.Binding{Role: role, Members: ms})
	}
	slices.SortFunc(out, func(a, b *iampb.Binding) int { return strings.Compare(a.Role, b.Role) })
	return out
}

func describeBindings(bs []*iampb.Binding) string {
	var parts []string
	for _, b := range bs {
		parts = append(parts, b.GetRole()+"="+strings.Join(b.GetMembers(), ","))
	}
	return strings.Join(parts, " ")
}

// TestIamPermissions returns the permissions of req that the caller holds
// on the resource, which need not exist: without access control, all of
// them.
func (s *Service) TestIamPermissions(ctx context.Context, req *iampb.TestIamPermissionsRequest) (*iampb.TestIamPermissionsResponse, error) {
	if KindOf(req.GetResource()) == "" {
		return nil, status.Errorf(codes.InvalidArgument, "Invalid resource name %q", req.GetResource())
	}
	principal := CallerOf(ctx).Principal
	out := &iampb.TestIamPermissionsResponse{}
	for _, p := range req.GetPermissions() {
		if !knownPermission(p) {
			return nil, status.Errorf(codes.InvalidArgument, "Permission %s is not valid for this resource.", p)
		}
		if s.guard == nil || s.guard.allowed(principal, p, req.GetResource()) {
			out.Permissions = append(out.Permissions, p)
		}
	}
	return out, nil
}

// Done is told of every call that succeeded: a resource it deleted loses
// its policy, so one created again under the same name starts without
// one, as in Google's service. For a deletion it blocks until the policy
// is dropped, for up to 10 s whatever ctx says (the call did succeed); a
// failure is logged, as the call's answer stands.
func (s *Service) Done(ctx context.Context, req proto.Message) {
	resource := deletedResource(req)
	if resource == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	st, err := s.policies.open(ctx, false)
	if err == nil && st != nil {
		err = st.Delete(ctx, resource)
	}
	if err != nil {
		s.audit.Warn("the policy of a deleted resource was not dropped", "resource", resource, "err", err)
	}
}

// UnaryInterceptor tells Done of every unary call that succeeded.
func (s *Service) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if m, ok := req.(proto.Message); ok && err == nil {
			s.Done(ctx, m)
		}
		return resp, err
	}
}

// deletedResource is the resource a successful call deleted, or "".
func deletedResource(req proto.Message) string {
	switch r := req.(type) {
	case *pb.DeleteTopicRequest:
		return r.GetTopic()
	case *pb.DeleteSubscriptionRequest:
		return r.GetSubscription()
	case *pb.DeleteSnapshotRequest:
		return r.GetSnapshot()
	case *pb.DeleteSchemaRequest:
		return r.GetName()
	}
	return ""
}
