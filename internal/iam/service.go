package iam

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strings"

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
// subscriptions, snapshots and schemas. Its calls are authorized before
// they reach it (UnaryInterceptor, or the REST routes).
type Service struct {
	iampb.UnimplementedIAMPolicyServer
	g *Guard
}

// Service returns the guard's IAMPolicy service.
func (g *Guard) Service() *Service { return &Service{g: g} }

// Register adds the service to a gRPC server.
func (s *Service) Register(gs *grpc.Server) { iampb.RegisterIAMPolicyServer(gs, s) }

// checkResource refuses a name that is not a topic, subscription,
// snapshot or schema, and one that does not exist.
func (s *Service) checkResource(ctx context.Context, resource string) error {
	if KindOf(resource) == "" || iamPermission(resource, "x") == "pubsub.unknown.x" {
		return status.Errorf(codes.InvalidArgument, "Invalid resource name %q: want projects/P/topics/T, projects/P/subscriptions/S, projects/P/snapshots/S or projects/P/schemas/S", resource)
	}
	if s.g.exists != nil {
		return s.g.exists(ctx, resource)
	}
	return nil
}

// GetIamPolicy returns a resource's own policy (not the project's).
func (s *Service) GetIamPolicy(ctx context.Context, req *iampb.GetIamPolicyRequest) (*iampb.Policy, error) {
	if v := req.GetOptions().GetRequestedPolicyVersion(); v < 0 || v > 3 {
		return nil, status.Errorf(codes.InvalidArgument, "Invalid requested policy version %d: want 0, 1 or 3", v)
	}
	if err := s.checkResource(ctx, req.GetResource()); err != nil {
		return nil, err
	}
	var pol *iampb.Policy
	var rev uint64
	if s.g.store != nil {
		pol, rev = s.g.store.Get(req.GetResource())
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
	if s.g.store == nil {
		return nil, status.Error(codes.FailedPrecondition, "resource policies are not stored by this sidecar")
	}
	_, current := s.g.store.Get(resource)
	expect := current
	if len(pol.GetEtag()) > 0 {
		rev, ok := revisionOf(pol.GetEtag())
		if !ok || rev != current {
			return nil, concurrentChange()
		}
		expect = rev
	}
	stored := &iampb.Policy{Version: 1, Bindings: normalize(pol.GetBindings())}
	rev, err := s.g.store.Set(ctx, resource, stored, expect)
	if errors.Is(err, errConcurrentChange) {
		return nil, concurrentChange()
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "store the policy: %v", err)
	}
	s.g.audit.Info("policy changed", "principal", orAnonymous(CallerOf(ctx).Principal), "method", "SetIamPolicy",
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
// on the resource, which need not exist.
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
		if s.g.allowed(principal, p, req.GetResource()) {
			out.Permissions = append(out.Permissions, p)
		}
	}
	return out, nil
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
