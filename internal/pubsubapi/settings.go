package pubsubapi

import (
	"encoding/json"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// subSettings are a subscription's Pub/Sub settings that the library does
// not act on, kept in its record (adapter.SubscriptionConfig.
// ServiceSettings) as JSON so that they read back as they were set. The
// topic's retention governs what is kept (docs/SIDECAR.md).
type subSettings struct {
	RetentionMS int64 `json:"retention_ms"`
	RetainAcked bool  `json:"retain_acked,omitempty"`
	// ExpirationMS is the expiration policy's ttl: nil for no policy
	// (never expires), 0 for a policy without a ttl (never expires
	// either, as the service reads it).
	ExpirationMS *int64 `json:"expiration_ms,omitempty"`
	// Push is the push_config of a push subscription; nil for a pull
	// subscription.
	Push *pushSettings `json:"push,omitempty"`
}

// pushSettings is a push_config as it was set (pushsubs.go delivers it).
type pushSettings struct {
	Endpoint      string            `json:"endpoint"`
	Attributes    map[string]string `json:"attributes,omitempty"`
	NoWrapper     bool              `json:"no_wrapper,omitempty"`
	WriteMetadata bool              `json:"write_metadata,omitempty"`
	// The oidc_token authentication method: kept and returned, but no
	// token is sent (docs/SIDECAR.md).
	OIDCServiceAccount string `json:"oidc_service_account_email,omitempty"`
	OIDCAudience       string `json:"oidc_audience,omitempty"`
	OIDC               bool   `json:"oidc,omitempty"`
}

// newPushSettings reads a push_config; an empty endpoint is a pull
// subscription (nil).
func newPushSettings(pc *pb.PushConfig) *pushSettings {
	if pc.GetPushEndpoint() == "" {
		return nil
	}
	ps := &pushSettings{Endpoint: pc.GetPushEndpoint(), Attributes: pc.GetAttributes()}
	if nw := pc.GetNoWrapper(); nw != nil {
		ps.NoWrapper, ps.WriteMetadata = true, nw.GetWriteMetadata()
	}
	if t := pc.GetOidcToken(); t != nil {
		ps.OIDC, ps.OIDCServiceAccount, ps.OIDCAudience = true, t.GetServiceAccountEmail(), t.GetAudience()
	}
	return ps
}

// proto is the push_config of ps; an empty one for a pull subscription.
func (ps *pushSettings) proto() *pb.PushConfig {
	if ps == nil {
		return &pb.PushConfig{}
	}
	out := &pb.PushConfig{PushEndpoint: ps.Endpoint, Attributes: ps.Attributes}
	if ps.NoWrapper {
		out.Wrapper = &pb.PushConfig_NoWrapper_{NoWrapper: &pb.PushConfig_NoWrapper{WriteMetadata: ps.WriteMetadata}}
	} else {
		out.Wrapper = &pb.PushConfig_PubsubWrapper_{PubsubWrapper: &pb.PushConfig_PubsubWrapper{}}
	}
	if ps.OIDC {
		out.AuthenticationMethod = &pb.PushConfig_OidcToken_{OidcToken: &pb.PushConfig_OidcToken{
			ServiceAccountEmail: ps.OIDCServiceAccount, Audience: ps.OIDCAudience}}
	}
	return out
}

// The service's bounds and defaults.
const (
	minSubRetention     = 10 * time.Minute
	maxSubRetention     = 7 * 24 * time.Hour
	defaultSubRetention = maxSubRetention
	defaultExpiration   = 31 * 24 * time.Hour
	minExpiration       = 24 * time.Hour
)

// newSubSettings reads the settings of a subscription being created,
// with the service's defaults for those not given.
func newSubSettings(sub *pb.Subscription) (*subSettings, error) {
	st := &subSettings{RetentionMS: defaultSubRetention.Milliseconds()}
	ttl := defaultExpiration.Milliseconds()
	st.ExpirationMS = &ttl
	for _, p := range []string{"message_retention_duration", "retain_acked_messages", "expiration_policy", "push_config"} {
		if err := st.update(p, sub); err != nil {
			return nil, err
		}
	}
	if sub.GetExpirationPolicy() == nil {
		st.ExpirationMS = &ttl // update cleared it: no policy given means the default
	}
	if sub.GetMessageRetentionDuration() == nil {
		st.RetentionMS = defaultSubRetention.Milliseconds()
	}
	return st, st.check()
}

// update sets the field path of the proto subscription in.
func (st *subSettings) update(path string, in *pb.Subscription) error {
	switch path {
	case "message_retention_duration":
		d := in.GetMessageRetentionDuration()
		if d == nil {
			st.RetentionMS = defaultSubRetention.Milliseconds()
			return nil
		}
		if err := d.CheckValid(); err != nil || d.AsDuration() < minSubRetention || d.AsDuration() > maxSubRetention {
			return invalid("invalid message_retention_duration %s: must be between %v and %v", d.AsDuration(), minSubRetention, maxSubRetention)
		}
		st.RetentionMS = d.AsDuration().Milliseconds()
	case "retain_acked_messages":
		st.RetainAcked = in.GetRetainAckedMessages()
	case "expiration_policy":
		p := in.GetExpirationPolicy()
		if p == nil {
			st.ExpirationMS = nil
			return nil
		}
		var ms int64
		if ttl := p.GetTtl(); ttl != nil {
			if err := ttl.CheckValid(); err != nil || ttl.AsDuration() < minExpiration {
				return invalid("invalid expiration_policy.ttl %s: must be at least %v", ttl.AsDuration(), minExpiration)
			}
			ms = ttl.AsDuration().Milliseconds()
		}
		st.ExpirationMS = &ms
	case "push_config":
		st.Push = newPushSettings(in.GetPushConfig())
	}
	return nil
}

// check applies the service's rule across fields: a subscription cannot
// expire before the messages it retains.
func (st *subSettings) check() error {
	if st.ExpirationMS != nil && *st.ExpirationMS > 0 && *st.ExpirationMS < st.RetentionMS {
		return invalid("expiration_policy.ttl %v is shorter than message_retention_duration %v",
			time.Duration(*st.ExpirationMS)*time.Millisecond, time.Duration(st.RetentionMS)*time.Millisecond)
	}
	return nil
}

func (st *subSettings) encode() []byte {
	b, _ := json.Marshal(st) // plain fields: cannot fail
	return b
}

// decodeSubSettings reads the stored settings; a subscription created
// before they were kept has the service's defaults.
func decodeSubSettings(b []byte) *subSettings {
	st := &subSettings{RetentionMS: defaultSubRetention.Milliseconds()}
	ttl := defaultExpiration.Milliseconds()
	st.ExpirationMS = &ttl
	if len(b) > 0 {
		_ = json.Unmarshal(b, st) // written by encode; a bad record keeps the defaults
	}
	return st
}

// apply writes the settings into the proto subscription out.
func (st *subSettings) apply(out *pb.Subscription) {
	out.MessageRetentionDuration = durationpb.New(time.Duration(st.RetentionMS) * time.Millisecond)
	out.RetainAckedMessages = st.RetainAcked
	out.PushConfig = st.Push.proto()
	if st.ExpirationMS != nil {
		out.ExpirationPolicy = &pb.ExpirationPolicy{}
		if *st.ExpirationMS > 0 {
			out.ExpirationPolicy.Ttl = durationpb.New(time.Duration(*st.ExpirationMS) * time.Millisecond)
		}
	}
}
