package pubsubapi

import (
	"strings"
	"testing"

	"github.com/jetorder/jetorder/internal/broker"
)

func TestAckIDRoundTripAndRefusals(t *testing.T) {
	s := New(broker.New(nil, nil, nil), Config{})
	const sub = "projects/p/subscriptions/sub-a"
	id := s.ackID(sub, 42, 7)
	if got, err := s.parseAckID(sub, id); err != nil || got != (ackRef{s.epoch, 42, 7}) || !s.own(got) {
		t.Fatalf("parseAckID(own id) = %v, %v", got, err)
	}
	// A later process with the same key (the sidecars' shared one) knows
	// the id as an earlier process's.
	later := New(broker.New(nil, nil, nil), Config{})
	later.ackKey = s.ackKey
	if got, err := later.parseAckID(sub, id); err != nil || got.seq != 7 || later.own(got) {
		t.Fatalf("a later process: parseAckID = %v, %v, want message 7 of another process", got, err)
	}
	other := New(broker.New(nil, nil, nil), Config{})
	tampered := []byte(id)
	tampered[0] ^= 1
	for name, bad := range map[string]string{
		"other subscription": s.ackID("projects/p/subscriptions/sub-b", 42, 7),
		"other key":          other.ackID(sub, 42, 7),
		"tampered":           string(tampered),
		"truncated":          id[:len(id)-1],
		"extended":           id + "A",
		"empty":              "",
		"not base64":         strings.Repeat("*", len(id)),
	} {
		if _, err := s.parseAckID(sub, bad); err == nil {
			t.Errorf("%s: ack id %q accepted", name, bad)
		}
	}
}

// FuzzParseAckID: no input panics, and only ids this server issued for the
// subscription are accepted.
func FuzzParseAckID(f *testing.F) {
	s := New(broker.New(nil, nil, nil), Config{})
	const sub = "projects/p/subscriptions/sub-a"
	f.Add(s.ackID(sub, 1, 1))
	f.Add(s.ackID(sub, 1<<63, 5))
	f.Add("")
	f.Add("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Fuzz(func(t *testing.T, ackID string) {
		ref, err := s.parseAckID(sub, ackID)
		if err == nil && s.ackID(sub, ref.lease, ref.seq) != ackID {
			t.Fatalf("accepted %q, which was not issued (it decodes to %v)", ackID, ref)
		}
	})
}
