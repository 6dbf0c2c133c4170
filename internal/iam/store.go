package iam

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
)

// PolicyBucket is the KV bucket of resource-level policies: one key per
// resource that has one (its name in base64url, as resource IDs may hold
// characters KV keys may not), its value the Policy in protobuf.
const PolicyBucket = "JO_IAM"

// Store keeps the resource-level policies in PolicyBucket. Every sidecar
// on the same JetStream watches the bucket, so authorization reads a local
// copy and a policy set through one sidecar holds on all of them moments
// later; the sidecar that set it holds it at once.
type Store struct {
	kv     jetstream.KeyValue
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.RWMutex
	policies map[string]*storedPolicy // by resource name
}

type storedPolicy struct {
	policy   *iampb.Policy // nil: deleted at revision
	grants   grants
	revision uint64
}

// OpenStore opens (or creates) the bucket and reads every policy in it
// before it returns; then it keeps watching until Close.
func OpenStore(ctx context.Context, js jetstream.JetStream, replicas int, log *slog.Logger) (*Store, error) {
	return openStore(ctx, js, replicas, log, true)
}

// errNoBucket is openStore's error for a bucket that does not exist and
// was not to be created.
var errNoBucket = errors.New("no bucket " + PolicyBucket)

func openStore(ctx context.Context, js jetstream.JetStream, replicas int, log *slog.Logger, create bool) (*Store, error) {
	kv, err := js.KeyValue(ctx, PolicyBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		if !create {
			return nil, errNoBucket
		}
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: PolicyBucket, Description: "jetorder: IAM policies of topics, subscriptions, snapshots and schemas",
			Storage: jetstream.FileStorage, Replicas: max(replicas, 1),
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, PolicyBucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open bucket %s: %w", PolicyBucket, err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	wctx, cancel := context.WithCancel(context.Background())
	// IncludeHistory is off: the watch starts with each key's last value.
	w, err := kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("watch bucket %s: %w", PolicyBucket, err)
	}
	s := &Store{kv: kv, log: log, cancel: cancel, done: make(chan struct{}), policies: map[string]*storedPolicy{}}
	// The first nil entry marks the end of the initial values.
	for initial := true; initial; {
		select {
		case e := <-w.Updates():
			if e == nil {
				initial = false
				break
			}
			s.apply(e)
		case <-ctx.Done():
			cancel()
			return nil, fmt.Errorf("read bucket %s: %w", PolicyBucket, ctx.Err())
		}
	}
	go func() {
		defer close(s.done)
		defer func() { _ = w.Stop() }()
		for {
			select {
			case e, ok := <-w.Updates():
				if !ok {
					// nats.go ends a watch whose consumer it could not
					// create again (a partition, the bucket's leader
					// lost): watched again, or policy changes made
					// through other sidecars would never reach this one.
					again := s.watchAgain(wctx, kv)
					if again == nil {
						return
					}
					w = again
					continue
				}
				if e != nil {
					s.apply(e)
				}
			case <-wctx.Done():
				return
			}
		}
	}()
	return s, nil
}

// watchAgain watches the bucket again, trying until it can or ctx ends
// (then nil). The new watch sends every key's last entry again, delete
// markers included, which apply takes in revision order.
func (s *Store) watchAgain(ctx context.Context, kv jetstream.KeyValue) jetstream.KeyWatcher {
	s.log.Warn("iam: policy watch ended; watching again", "bucket", PolicyBucket)
	delay := 200 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
		w, err := kv.WatchAll(ctx)
		if err == nil {
			return w
		}
		s.log.Warn("iam: policies not watched; trying again", "bucket", PolicyBucket, "err", err)
		delay = min(2*delay, 5*time.Second)
	}
}

// Close stops the watch.
func (s *Store) Close() {
	s.cancel()
	<-s.done
}

func policyKey(resource string) string { return base64.RawURLEncoding.EncodeToString([]byte(resource)) }

// apply takes one entry of the watch, unless the store already holds a
// later revision of its key (set through this store).
func (s *Store) apply(e jetstream.KeyValueEntry) {
	name, err := base64.RawURLEncoding.DecodeString(e.Key())
	if err != nil {
		s.log.Warn("iam: key in bucket "+PolicyBucket+" is not a resource name; ignored", "key", e.Key())
		return
	}
	sp := &storedPolicy{revision: e.Revision()}
	if e.Operation() == jetstream.KeyValuePut {
		pol := &iampb.Policy{}
		if err := proto.Unmarshal(e.Value(), pol); err != nil {
			s.log.Warn("iam: policy in bucket "+PolicyBucket+" does not decode; the resource has none", "resource", string(name), "err", err)
			pol = nil
		} else {
			sp.policy, sp.grants = pol, compile(pol.GetBindings())
		}
	}
	s.put(string(name), sp)
}

func (s *Store) put(resource string, sp *storedPolicy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.policies[resource]; old != nil && old.revision >= sp.revision {
		return
	}
	s.policies[resource] = sp
}

// grants returns resource's compiled policy; nil when it has none.
func (s *Store) grants(resource string) grants {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if sp := s.policies[resource]; sp != nil {
		return sp.grants
	}
	return nil
}

// Get returns resource's policy and the revision it was stored at; a nil
// policy and revision 0 when it has none.
func (s *Store) Get(resource string) (*iampb.Policy, uint64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if sp := s.policies[resource]; sp != nil && sp.policy != nil {
		return sp.policy, sp.revision
	}
	return nil, 0
}

// errConcurrentChange is a Set whose expected revision was not the
// stored one.
var errConcurrentChange = errors.New("concurrent policy change")

// Set stores pol as resource's policy if the stored one is still at
// revision (0: none), and returns the new revision.
func (s *Store) Set(ctx context.Context, resource string, pol *iampb.Policy, revision uint64) (uint64, error) {
	data, err := proto.Marshal(pol)
	if err != nil {
		return 0, err
	}
	key := policyKey(resource)
	var rev uint64
	if revision == 0 {
		// The key may hold a delete marker: Create takes its place.
		rev, err = s.kv.Create(ctx, key, data)
		if errors.Is(err, jetstream.ErrKeyExists) {
			err = errConcurrentChange
		}
	} else {
		rev, err = s.kv.Update(ctx, key, data, revision)
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			err = errConcurrentChange
		}
	}
	if err != nil {
		return 0, err
	}
	s.put(resource, &storedPolicy{policy: pol, grants: compile(pol.GetBindings()), revision: rev})
	return rev, nil
}

// Delete drops resource's policy, if it has one: a deleted resource's
// policy does not pass to a new one of the same name, as in Google's
// service.
func (s *Store) Delete(ctx context.Context, resource string) error {
	s.mu.RLock()
	sp := s.policies[resource]
	s.mu.RUnlock()
	if sp == nil || sp.policy == nil {
		return nil
	}
	if err := s.kv.Delete(ctx, policyKey(resource)); err != nil {
		return err
	}
	s.put(resource, &storedPolicy{revision: sp.revision + 1})
	return nil
}

// LazyStore is a Store opened on first use, as the sidecar's other
// buckets: a sidecar without access control whose resource policies no
// one reads or sets creates no bucket. It is safe for concurrent use.
type LazyStore struct {
	js       jetstream.JetStream
	replicas int
	log      *slog.Logger

	mu     sync.Mutex // held while opening
	store  *Store
	closed bool
}

// NewLazyStore returns a LazyStore of the bucket on js, created with
// replicas when it does not exist.
func NewLazyStore(js jetstream.JetStream, replicas int, log *slog.Logger) *LazyStore {
	return &LazyStore{js: js, replicas: replicas, log: log}
}

// Open returns the store, opening it on the first call that succeeds
// (which waits, up to ctx's end, for every policy in the bucket); later
// calls return it at once. With create false, a bucket that does not
// exist yet is not created: Open returns nil and no error, since no
// resource has a policy.
func (l *LazyStore) Open(ctx context.Context, create bool) (*Store, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errors.New("iam: the policy store is closed")
	}
	if l.store != nil {
		return l.store, nil
	}
	s, err := openStore(ctx, l.js, l.replicas, l.log, create)
	if errors.Is(err, errNoBucket) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	l.store = s
	return s, nil
}

// Close stops the store's watch, if it was opened; later Opens fail.
func (l *LazyStore) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.store != nil {
		l.store.Close()
		l.store = nil
	}
}
