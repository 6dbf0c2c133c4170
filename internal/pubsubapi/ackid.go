package pubsubapi

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/jetorder/jetorder/internal/grpcutil"
)

// Ack ids.
//
// An ack id is base64url of: the issuing process's epoch (8 bytes, random
// per process), the lease id in that process (8), the message's stream
// sequence (8), and the first 16 bytes of HMAC-SHA256(key, subscription
// name, 0, the 24 bytes before). The key is shared by the sidecars of one
// NATS server and kept in the KV bucket JO_SIDECAR, so an ack id issued
// before a restart is still recognised as one of ours; one made by a
// client is refused before anything is looked up.
//
// Each ack id of a request is applied on its own (ackRef):
//   - an id of this process names a lease, which is acked, nacked or
//     extended;
//   - an id of an earlier process (a sidecar that restarted) names a stored
//     message: an ack of it is honoured, by acking the lease that holds the
//     message now, or, if the message is not delivered yet and has no
//     ordering key (or its subscription no ordering), when it arrives
//     (staleAcks); a deadline change of it does nothing;
//   - an id this sidecar cannot have issued for the subscription is
//     refused, and the call fails with INVALID_ARGUMENT once the others
//     are applied.

const (
	ackIDMACBytes = 16
	ackIDRawBytes = 24 + ackIDMACBytes

	ackKeyBucket = "JO_SIDECAR"
	ackKeyName   = "ack-id-key"
)

// ackRef is what an ack id names.
type ackRef struct {
	epoch uint64 // the issuing process; 0 for an id refused
	lease uint64
	seq   uint64 // the message's stream sequence
}

func (s *Server) ackID(sub string, lease, seq uint64) string {
	var buf [ackIDRawBytes]byte
	binary.BigEndian.PutUint64(buf[0:8], s.epoch)
	binary.BigEndian.PutUint64(buf[8:16], lease)
	binary.BigEndian.PutUint64(buf[16:24], seq)
	copy(buf[24:], s.ackMAC(sub, buf[:24]))
	return base64.RawURLEncoding.EncodeToString(buf[:])
}

// ackMAC is the MAC of an ack id's body issued for sub. Every message
// delivered and every ack id that comes back takes one: the keyed hashes
// are pooled, since setting one up (hmac.New) costs more than the MAC of
// an ack id's few bytes.
func (s *Server) ackMAC(sub string, body []byte) []byte {
	h, _ := s.ackMACs.Get().(hash.Hash)
	if h == nil {
		h = hmac.New(sha256.New, s.ackKey)
	} else {
		h.Reset()
	}
	h.Write([]byte(sub))
	h.Write([]byte{0})
	h.Write(body)
	sum := h.Sum(nil)[:ackIDMACBytes]
	s.ackMACs.Put(h)
	return sum
}

var errInvalidAckID = errors.New("invalid ack id")

// parseAckID returns what an ack id issued for sub names.
func (s *Server) parseAckID(sub, ackID string) (ackRef, error) {
	if len(ackID) != base64.RawURLEncoding.EncodedLen(ackIDRawBytes) {
		return ackRef{}, errInvalidAckID
	}
	raw, err := base64.RawURLEncoding.DecodeString(ackID)
	if err != nil || len(raw) != ackIDRawBytes || !hmac.Equal(raw[24:], s.ackMAC(sub, raw[:24])) {
		return ackRef{}, errInvalidAckID
	}
	ref := ackRef{epoch: binary.BigEndian.Uint64(raw[0:8]), lease: binary.BigEndian.Uint64(raw[8:16]), seq: binary.BigEndian.Uint64(raw[16:24])}
	if ref.epoch == 0 {
		return ackRef{}, errInvalidAckID
	}
	return ref, nil
}

// parseAckIDs parses each ack id of a request. Refused ones have epoch 0
// in refs, and refused is the error to return once the others are
// applied (nil when none is refused).
func (s *Server) parseAckIDs(sub string, ackIDs []string) (refs []ackRef, refused error) {
	refs = make([]ackRef, len(ackIDs))
	n := 0
	for i, a := range ackIDs {
		ref, err := s.parseAckID(sub, a)
		if err != nil {
			if refused == nil {
				refused = status.Errorf(codes.InvalidArgument, "invalid ack id %.40q for %s: not issued for this subscription by this sidecar", a, sub)
			}
			n++
			continue
		}
		refs[i] = ref
	}
	if n > 0 {
		s.b.Metrics.AckIDsRefused.Add(float64(n))
	}
	return refs, refused
}

// own says whether ref was issued by this process.
func (s *Server) own(ref ackRef) bool { return ref.epoch == s.epoch }

// newEpoch is a random process epoch, never 0.
func newEpoch() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if e := binary.BigEndian.Uint64(b[:]); e != 0 {
			return e
		}
	}
}

// loadAckKey returns the ack id key the sidecars of js's server share,
// creating it if none exists yet.
func loadAckKey(ctx context.Context, js jetstream.JetStream, replicas int) ([]byte, error) {
	b := grpcutil.LazyBucket{Config: jetstream.KeyValueConfig{
		Bucket:      ackKeyBucket,
		Description: "jetorder: settings every sidecar on this server shares (the ack id key)",
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}}
	kv, err := b.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	if _, err := kv.Create(ctx, ackKeyName, key); err == nil {
		return key, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return nil, err
	}
	e, err := kv.Get(ctx, ackKeyName) // another sidecar made it first
	if err != nil {
		return nil, err
	}
	if len(e.Value()) < 16 {
		return nil, errors.New("ack id key in " + ackKeyBucket + " is too short")
	}
	return e.Value(), nil
}

// staleAcks are acks of messages named by ack ids of an earlier process
// that no lease holds now: the message is acked when it is delivered
// again (dispatcher.handle). Entries live for staleAckLife, the longest
// a message can wait for its redelivery (the longest ack deadline, and
// some), and there are at most maxStaleAcks.
type staleAcks struct {
	any  atomic.Bool // there are entries: take's fast path
	mu   sync.Mutex
	subs map[string]map[uint64]time.Time // subscription -> stream sequence -> expiry
	n    int
}

const (
	staleAckLife = 15 * time.Minute
	maxStaleAcks = 100_000
)

func (a *staleAcks) add(sub string, seq uint64) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if a.n >= maxStaleAcks {
		a.pruneLocked(now)
		if a.n >= maxStaleAcks {
			return false
		}
	}
	if a.subs == nil {
		a.subs = make(map[string]map[uint64]time.Time)
	}
	m := a.subs[sub]
	if m == nil {
		m = make(map[uint64]time.Time)
		a.subs[sub] = m
	}
	if _, ok := m[seq]; !ok {
		a.n++
	}
	m[seq] = now.Add(staleAckLife)
	a.any.Store(true)
	return true
}

// take reports whether an ack of sub's message seq is waiting, and
// removes it.
func (a *staleAcks) take(sub string, seq uint64) bool {
	if !a.any.Load() {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.subs[sub]
	exp, ok := m[seq]
	if !ok {
		return false
	}
	delete(m, seq)
	if len(m) == 0 {
		delete(a.subs, sub)
	}
	a.n--
	a.any.Store(a.n > 0)
	return time.Now().Before(exp)
}

func (a *staleAcks) pruneLocked(now time.Time) {
	for sub, m := range a.subs {
		for seq, exp := range m {
			if now.After(exp) {
				delete(m, seq)
				a.n--
			}
		}
		if len(m) == 0 {
			delete(a.subs, sub)
		}
	}
	a.any.Store(a.n > 0)
}
