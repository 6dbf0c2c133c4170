package pubsubapi

import (
	"strings"
	"testing"

	"github.com/jetorder/jetorder/internal/broker"
)

func TestAckIDRoundTripAndRefusals(t *testing.T) {
	s := New(broker.New(nil, nil, nil), Config{})
	const sub = "projects/p/subscriptions/sub-a"
	id := s.ackID(sub, 42)
	if got, err := s.parseAckID(sub, id); err != nil || got != 42 {
		t.Fatalf("parseAckID(own id) = %d, %v", got, err)
	}
	other := New(broker.New(nil, nil, nil), Config{})
	tampered := []byte(id)
	tampered[0] ^= 1
	for name, bad := range map[string]string{
		"other subscription": s.ackID("projects/p/subscriptions/sub-b", 42),
		"other process":      other.ackID(sub, 42),
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
	f.Add(s.ackID(sub, 1))
	f.Add(s.ackID(sub, 1<<63))
	f.Add("")
	f.Add("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA")
	f.Fuzz(func(t *testing.T, ackID string) {
		id, err := s.parseAckID(sub, ackID)
		if err == nil && s.ackID(sub, id) != ackID {
			t.Fatalf("accepted %q, which was not issued (it decodes to lease %d)", ackID, id)
		}
	})
}
