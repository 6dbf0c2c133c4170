package sidecar

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/internal/iam"
)

// accessConfigured reports whether any way to authenticate callers is
// configured, which turns access control on.
func (c Config) accessConfigured() bool {
	return c.TLSClientCA != "" || c.AuthTokens != "" || c.AuthJWKS != ""
}

// checkExposure refuses APIs that listen beyond loopback without access
// control, unless AllowUnauthenticated says so: whoever reaches such a
// port could read, delete and seek anything.
func (s *sidecar) checkExposure() error {
	if s.cfg.accessConfigured() || s.cfg.AllowUnauthenticated {
		return nil
	}
	exposed := func(flag string, addr net.Addr) error {
		return fmt.Errorf("%s %s listens beyond loopback without access control: configure --auth-tokens, --tls-client-ca or --auth-jwks (docs/OPERATING.md, \"Access control\"), or pass --allow-unauthenticated to serve anyone who reaches it", flag, addr)
	}
	if beyondLoopback(s.gl.Addr()) {
		return exposed("--grpc-addr", s.gl.Addr())
	}
	if s.hl != nil && beyondLoopback(s.hl.Addr()) {
		return exposed("--http-addr", s.hl.Addr())
	}
	return nil
}

// setupAccess builds the store of the resource policies and, when access
// control is configured, the guard, for which the store is opened at once
// (authorization reads it); without access control it is opened on first
// use, and its policies enforce nothing.
func (s *sidecar) setupAccess(ctx context.Context) error {
	cfg := s.cfg
	s.policies = iam.NewLazyStore(s.js, max(cfg.Replicas, 1), s.log)
	if !cfg.accessConfigured() {
		if cfg.IAMPolicy != "" {
			return errors.New("--iam-policy needs a way to authenticate callers: --auth-tokens, --tls-client-ca or --auth-jwks")
		}
		return nil
	}
	projects := iam.DefaultProjectPolicy()
	if cfg.IAMPolicy != "" {
		var err error
		if projects, err = iam.LoadProjectPolicy(cfg.IAMPolicy); err != nil {
			return fmt.Errorf("--iam-policy: %w", err)
		}
	}
	var jwt *iam.JWTConfig
	if cfg.AuthJWKS != "" {
		jwt = &iam.JWTConfig{JWKSFile: cfg.AuthJWKS, Issuer: cfg.AuthJWTIssuer, Audiences: cfg.AuthJWTAudiences}
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	store, err := s.policies.Open(octx, true)
	if err != nil {
		return err
	}
	g, err := iam.New(iam.Config{
		TokensFile:  cfg.AuthTokens,
		ClientCerts: cfg.TLSClientCA != "",
		JWT:         jwt,
		Projects:    projects,
		Policies:    store,
		TopicOf:     s.topicOf,
		Exists:      s.exists,
		Logger:      s.log,
	})
	if err != nil {
		return err // setup closes the store
	}
	s.guard = g
	policy := "every authenticated caller is roles/pubsub.admin (no --iam-policy)"
	if cfg.IAMPolicy != "" {
		policy = cfg.IAMPolicy
	}
	s.log.Info("access control on", "authentication", g.Describe(), "iam_policy", policy, "open_endpoints", cfg.OpenEndpoints)
	return nil
}

// topicOf is the topic a subscription is attached to.
func (s *sidecar) topicOf(ctx context.Context, sub string) (string, error) {
	got, err := s.api.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub})
	if err != nil {
		return "", err
	}
	return got.GetTopic(), nil
}

// exists returns nil when resource exists, else the Get method's error
// (NOT_FOUND).
func (s *sidecar) exists(ctx context.Context, resource string) error {
	var err error
	switch iam.KindOf(resource) {
	case "topics":
		_, err = s.api.GetTopic(ctx, &pb.GetTopicRequest{Topic: resource})
	case "subscriptions":
		_, err = s.api.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: resource})
	case "snapshots":
		_, err = s.api.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: resource})
	case "schemas":
		_, err = s.schemas.GetSchema(ctx, &pb.GetSchemaRequest{Name: resource})
	default:
		err = status.Errorf(codes.InvalidArgument, "Invalid resource name %q", resource)
	}
	return err
}

// loadCA reads a PEM file of CA certificates.
func loadCA(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New(path + ": no PEM certificates")
	}
	return pool, nil
}
