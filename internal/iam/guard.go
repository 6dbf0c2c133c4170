package iam

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Google's texts for calls without, or with bad, credentials and for
// calls refused.
const (
	missingCredentialsText = "Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
	invalidCredentialsText = "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
	deniedText             = "User not authorized to perform this action."
)

var (
	errMissingCredentials = status.Error(codes.Unauthenticated, missingCredentialsText)
	errInvalidCredentials = status.Error(codes.Unauthenticated, invalidCredentialsText)
	errDenied             = status.Error(codes.PermissionDenied, deniedText)
	errQueryToken         = status.Error(codes.Unauthenticated, "access tokens in the query string are refused (they end up in logs and histories): send the header Authorization: Bearer TOKEN")
)

// Config configures a Guard. At least one way to authenticate must be
// set: TokensFile, ClientCerts or JWT.
type Config struct {
	// TokensFile holds bearer tokens: "PRINCIPAL TOKEN" or
	// "PRINCIPAL sha256:HEX" per line.
	TokensFile string
	// ClientCerts: verified TLS client certificates name principals (the
	// TLS configuration that verifies them is the server's).
	ClientCerts bool
	// JWT verifies bearer tokens that are JWTs; nil: none are.
	JWT *JWTConfig
	// Projects is the project-level policy; nil means
	// DefaultProjectPolicy.
	Projects *ProjectPolicy
	// Policies holds the resource-level policies; nil: resources have
	// none, and SetIamPolicy fails. The Service drops the policy of a
	// resource deleted (Service.Done).
	Policies *Store
	// TopicOf returns the topic a subscription is attached to, for
	// DetachSubscription's permission on that topic.
	TopicOf func(ctx context.Context, subscription string) (string, error)
	// Exists returns nil when a resource exists, and a NOT_FOUND status
	// when it does not: GetIamPolicy and SetIamPolicy ask it.
	Exists func(ctx context.Context, resource string) error
	// Logger gets the audit log: every call refused, every policy
	// changed, at Info with audit=true.
	Logger *slog.Logger
}

// Guard authenticates callers and authorizes their calls. A nil *Guard
// allows everything.
type Guard struct {
	tokens   tokenSet
	mtls     bool
	jwt      *JWTVerifier
	projects *ProjectPolicy
	store    *Store
	topicOf  func(context.Context, string) (string, error)
	exists   func(context.Context, string) error
	audit    *slog.Logger
}

// New builds a Guard, reading its files; their errors name them.
func New(cfg Config) (*Guard, error) {
	if cfg.TokensFile == "" && !cfg.ClientCerts && cfg.JWT == nil {
		return nil, errors.New("iam: no way to authenticate callers is configured")
	}
	g := &Guard{mtls: cfg.ClientCerts, projects: cfg.Projects, store: cfg.Policies,
		topicOf: cfg.TopicOf, exists: cfg.Exists}
	var err error
	if cfg.TokensFile != "" {
		if g.tokens, err = loadTokens(cfg.TokensFile); err != nil {
			return nil, err
		}
	}
	if cfg.JWT != nil {
		if g.jwt, err = NewJWTVerifier(*cfg.JWT); err != nil {
			return nil, err
		}
	}
	if g.projects == nil {
		g.projects = DefaultProjectPolicy()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g.audit = log.With("audit", true)
	return g, nil
}

// allowed reports whether principal holds perm on resource: through the
// project-level policy of its project, or the resource's own policy.
func (g *Guard) allowed(principal, perm, resource string) bool {
	if g.projects.allows(strings.TrimPrefix(ProjectOf(resource), "projects/"), perm, principal) {
		return true
	}
	if g.store != nil && resource != ProjectOf(resource) {
		return g.store.grants(resource).allows(perm, principal)
	}
	return false
}

// Authorize checks that the caller ctx carries may make the call whose
// request is req; method names the call in the audit log. It returns nil,
// or UNAUTHENTICATED for a caller without credentials and
// PERMISSION_DENIED for another, with Google's texts, which name no
// resource.
func (g *Guard) Authorize(ctx context.Context, method string, req proto.Message) error {
	if g == nil {
		return nil
	}
	caller := CallerOf(ctx)
	r, ok := rules[req.ProtoReflect().Descriptor().FullName()]
	if !ok {
		// A method without a rule: refused, so a method added without one
		// stays closed.
		g.deny(caller, method, "", "(no rule for "+string(req.ProtoReflect().Descriptor().FullName())+")")
		return g.refusal(caller)
	}
	needs := r(ctx, g, req)
	if len(needs) == 0 && caller.Principal == "" {
		// A call that needs no permission (TestIamPermissions) still needs
		// a caller with credentials, as every call of Google's service.
		g.deny(caller, method, "", "(credentials)")
		return errMissingCredentials
	}
	for _, n := range needs {
		if !g.allowed(caller.Principal, n.perm, n.resource) {
			g.deny(caller, method, n.resource, n.perm)
			return g.refusal(caller)
		}
	}
	return nil
}

// refusal is the error for a refused caller.
func (g *Guard) refusal(c Caller) error {
	if c.Principal == "" {
		return errMissingCredentials
	}
	return errDenied
}

func (g *Guard) deny(c Caller, method, resource, perm string) {
	g.audit.Info("access denied", "principal", orAnonymous(c.Principal), "method", method, "resource", resource, "permission", perm)
}

func orAnonymous(p string) string {
	if p == "" {
		return "(anonymous)"
	}
	return p
}

// Allows reports whether the caller ctx carries holds perm on resource
// (a project "projects/P" or a resource in one): for pages that show only
// what the caller may see.
func (g *Guard) Allows(ctx context.Context, perm, resource string) bool {
	return g == nil || g.allowed(CallerOf(ctx).Principal, perm, resource)
}

// AllowsSomewhere reports whether the caller holds perm in some project;
// AllowsEverywhere whether in every project.
func (g *Guard) AllowsSomewhere(ctx context.Context, perm string) bool {
	return g == nil || g.projects.anyProject(perm, CallerOf(ctx).Principal)
}

// AllowsEverywhere reports whether the caller holds perm in every project.
func (g *Guard) AllowsEverywhere(ctx context.Context, perm string) bool {
	return g == nil || g.projects.allowsEverywhere(perm, CallerOf(ctx).Principal)
}

// Refusal is the error for the caller ctx carries when it may not do
// something: UNAUTHENTICATED without credentials, else PERMISSION_DENIED;
// what is logged in the audit log names method.
func (g *Guard) Refusal(ctx context.Context, method, perm string) error {
	c := CallerOf(ctx)
	g.deny(c, method, "", perm)
	return g.refusal(c)
}

// AuthenticateHTTP returns r's context carrying its caller, or an
// UNAUTHENTICATED status: for bad credentials, and for a token in the
// query string.
func (g *Guard) AuthenticateHTTP(r *http.Request) (context.Context, error) {
	if g == nil {
		return r.Context(), nil
	}
	if r.URL.Query().Has("access_token") {
		g.audit.Info("access denied", "principal", "(anonymous)", "method", r.Method+" "+r.URL.Path, "reason", "access_token in the query string")
		return nil, errQueryToken
	}
	var c presented
	if vs := r.Header.Values("Authorization"); len(vs) > 0 {
		var ok bool
		c.bearer, ok = parseAuthorization(vs[0])
		c.badHeader = !ok || len(vs) > 1
	}
	if r.TLS != nil {
		c.chains = r.TLS.VerifiedChains
	}
	caller, err := g.authenticate(c)
	if err != nil {
		g.audit.Info("access denied", "principal", "(invalid credentials)", "method", r.Method+" "+r.URL.Path, "reason", err.Error())
		return nil, errInvalidCredentials
	}
	return WithCaller(r.Context(), caller), nil
}

// authenticateGRPC returns ctx carrying the caller of a gRPC call.
func (g *Guard) authenticateGRPC(ctx context.Context, method string) (context.Context, error) {
	var c presented
	md, _ := metadata.FromIncomingContext(ctx)
	if vs := md.Get("authorization"); len(vs) > 0 {
		var ok bool
		c.bearer, ok = parseAuthorization(vs[0])
		c.badHeader = !ok || len(vs) > 1
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			c.chains = ti.State.VerifiedChains
		}
	}
	caller, err := g.authenticate(c)
	if err != nil {
		g.audit.Info("access denied", "principal", "(invalid credentials)", "method", method, "reason", err.Error())
		return nil, errInvalidCredentials
	}
	return WithCaller(ctx, caller), nil
}

// open reports whether a gRPC method is served to every caller: health
// checks.
func open(method string) bool { return strings.HasPrefix(method, "/grpc.health.v1.Health/") }

// authenticatedOnly reports whether a gRPC method needs a caller with
// credentials and no permission: server reflection, which describes the
// API, not its resources.
func authenticatedOnly(method string) bool {
	return strings.HasPrefix(method, "/grpc.reflection.")
}

// UnaryInterceptor authenticates and authorizes every unary call.
func (g *Guard) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if open(info.FullMethod) {
			return handler(ctx, req)
		}
		ctx, err := g.authenticateGRPC(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		m, ok := req.(proto.Message)
		if !ok {
			return nil, status.Errorf(codes.Internal, "request of %s is not a protocol buffer", info.FullMethod)
		}
		if err := g.Authorize(ctx, info.FullMethod, m); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor authenticates every stream and authorizes it on its
// first request (StreamingPull names its subscription there).
func (g *Guard) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if open(info.FullMethod) {
			return handler(srv, ss)
		}
		ctx, err := g.authenticateGRPC(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		if authenticatedOnly(info.FullMethod) {
			if CallerOf(ctx).Principal == "" {
				return errMissingCredentials
			}
			return handler(srv, &guardedStream{ServerStream: ss, ctx: ctx, authorized: true})
		}
		return handler(srv, &guardedStream{ServerStream: ss, ctx: ctx, g: g, method: info.FullMethod})
	}
}

// guardedStream carries the caller in its context and authorizes the
// first message it receives.
type guardedStream struct {
	grpc.ServerStream
	ctx        context.Context
	g          *Guard
	method     string
	authorized bool
}

func (s *guardedStream) Context() context.Context { return s.ctx }

func (s *guardedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.authorized {
		return nil
	}
	pm, ok := m.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "request of %s is not a protocol buffer", s.method)
	}
	if err := s.g.Authorize(s.ctx, s.method, pm); err != nil {
		return err
	}
	s.authorized = true
	return nil
}

// Describe says how callers are authenticated, for the start-up log.
func (g *Guard) Describe() string {
	var ways []string
	if g.tokens != nil {
		ways = append(ways, fmt.Sprintf("%d bearer tokens", len(g.tokens)))
	}
	if g.mtls {
		ways = append(ways, "client certificates")
	}
	if g.jwt != nil {
		ways = append(ways, "JWTs")
	}
	return strings.Join(ways, ", ")
}
