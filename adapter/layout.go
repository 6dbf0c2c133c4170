package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LayoutVersion is the storage layout this build reads and writes: its
// streams, consumers, buckets and records (docs/WIRE.md). The account's
// layout record says which layout the account holds; a build meeting a
// newer one refuses to work on it, and one meeting an older one migrates
// it first (EnsureLayout).
//
//   - 1: no record. Accounts written before the record: subscription
//     records of ordered subscriptions may lack their delivery mode (per
//     key).
//   - 2: the record; every ordered subscription's record names its
//     delivery mode.
const LayoutVersion = 2

const (
	layoutBucket = "JO_LAYOUT"
	layoutKey    = "layout"
)

// ErrLayoutNewer reports an account whose storage layout is newer than
// this build knows: written by a later version. Nothing was written.
var ErrLayoutNewer = errors.New("storage layout newer than this build knows")

// layoutRecord is the value of the layout record.
type layoutRecord struct {
	Version int    `json:"version"`
	Since   string `json:"since,omitempty"` // when it was written, RFC 3339
}

// A migration brings an account from layout to layout+1. It must be
// idempotent, since a migration killed halfway runs again from its start,
// and readable by the builds of the layout before, which may run beside
// it during a rolling upgrade.
type migration struct {
	from int
	what string
	run  func(ctx context.Context, js jetstream.JetStream, log *slog.Logger) error
}

var migrations = []migration{
	{from: 1, what: "subscription records name their delivery mode", run: migrateDeliveryMode},
}

// EnsureLayout makes the account's storage layout this build's, before
// anything else is written: it returns an error wrapping ErrLayoutNewer,
// naming both versions, when the account holds a newer layout, and writes
// nothing then; on an older one it runs the migrations in order and then
// writes the record. Builds running side by side may call it at once; a
// migration killed halfway is run again by the next call. replicas is the
// layout bucket's replica count when it is created. The library's Client
// calls it before its first write; the sidecar at its start.
func EnsureLayout(ctx context.Context, js jetstream.JetStream, replicas int, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	found, err := readLayout(ctx, js)
	if err != nil {
		return err
	}
	if found == LayoutVersion {
		return nil
	}
	if found > LayoutVersion {
		return fmt.Errorf("%w: the NATS account holds jetorder storage layout %d, and this build knows layouts up to %d; run a build that knows layout %d (a downgrade across a layout change is not supported)",
			ErrLayoutNewer, found, LayoutVersion, found)
	}
	for _, m := range migrations {
		if m.from < found || m.from >= LayoutVersion {
			continue
		}
		start := time.Now()
		log.Info("migrating the storage layout", "from", m.from, "to", m.from+1, "step", m.what)
		if err := m.run(ctx, js, log); err != nil {
			return fmt.Errorf("storage layout migration %d to %d (%s): %w", m.from, m.from+1, m.what, err)
		}
		log.Info("storage layout migrated", "from", m.from, "to", m.from+1, "took", time.Since(start).Round(time.Millisecond))
	}
	return writeLayout(ctx, js, replicas)
}

// AccountLayout returns the storage layout the account's record names:
// 1 when there is none (an account of a build before the record, or one
// nothing was written to yet). It writes nothing.
func AccountLayout(ctx context.Context, js jetstream.JetStream) (int, error) {
	return readLayout(ctx, js)
}

// readLayout returns the account's layout: 1 without a record.
func readLayout(ctx context.Context, js jetstream.JetStream) (int, error) {
	kv, err := js.KeyValue(ctx, layoutBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return 1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the storage layout record: %w", err)
	}
	e, err := kv.Get(ctx, layoutKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read the storage layout record: %w", err)
	}
	var rec layoutRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Version < 1 {
		return 0, fmt.Errorf("the storage layout record (bucket %s, key %s) is not one this build can read: %q", layoutBucket, layoutKey, e.Value())
	}
	return rec.Version, nil
}

// writeLayout records this build's layout, unless a build running beside
// it recorded the same or a newer one first.
func writeLayout(ctx context.Context, js jetstream.JetStream, replicas int) error {
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      layoutBucket,
		Description: "jetorder: the storage layout version of this account",
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
		History:     8, // the layouts the account went through
	})
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, layoutBucket)
	}
	if err != nil {
		return fmt.Errorf("write the storage layout record: %w", err)
	}
	val, _ := json.Marshal(layoutRecord{Version: LayoutVersion, Since: time.Now().UTC().Format(time.RFC3339)})
	for {
		e, err := kv.Get(ctx, layoutKey)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = kv.Create(ctx, layoutKey, val)
		case err != nil:
		default:
			var rec layoutRecord
			if json.Unmarshal(e.Value(), &rec) == nil && rec.Version > LayoutVersion {
				return fmt.Errorf("%w: a build of layout %d recorded it while this one (layout %d) migrated", ErrLayoutNewer, rec.Version, LayoutVersion)
			}
			if rec.Version == LayoutVersion {
				return nil // written beside us
			}
			_, err = kv.Update(ctx, layoutKey, val, e.Revision())
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongLastSequence(err) {
			return fmt.Errorf("write the storage layout record: %w", err)
		}
		// Another build wrote it between our read and write: read again.
	}
}

func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// migrateDeliveryMode (1 to 2) writes the delivery mode into the records
// of ordered subscriptions written before partitioned delivery, which
// name none and mean per key. Each record is rewritten with a compare-and-set
// on its revision, its other members kept as they are, so a record a
// sidecar changes meanwhile is read again.
func migrateDeliveryMode(ctx context.Context, js jetstream.JetStream, log *slog.Logger) error {
	kv, err := js.KeyValue(ctx, subscriptionsBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil // no subscription yet
	}
	if err != nil {
		return err
	}
	all, err := kv.Keys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var keys []string
	for _, k := range all {
		if strings.Count(k, ".") == 1 { // <enc(P)>.<enc(S)>: a record; floors have more tokens
			keys = append(keys, k)
		}
	}
	changed := 0
	last := time.Now()
	for i, k := range keys {
		did, err := addDeliveryMode(ctx, kv, k)
		if err != nil {
			return fmt.Errorf("subscription record %s: %w", k, err)
		}
		if did {
			changed++
		}
		if time.Since(last) >= 2*time.Second {
			log.Info("migrating subscription records", "done", i+1, "of", len(keys), "rewritten", changed)
			last = time.Now()
		}
	}
	log.Info("subscription records migrated", "records", len(keys), "rewritten", changed)
	return nil
}

// addDeliveryMode rewrites record k with "delivery": "per-key" if it is
// ordered and names no delivery mode, and reports whether it did.
func addDeliveryMode(ctx context.Context, kv jetstream.KeyValue, k string) (bool, error) {
	for {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return false, nil // deleted meanwhile
		}
		if err != nil {
			return false, err
		}
		var rec map[string]json.RawMessage
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return false, fmt.Errorf("not a subscription record: %w", err)
		}
		if _, ok := rec["delivery"]; ok || string(rec["ordering"]) != "true" {
			return false, nil // unordered subscriptions have no delivery mode
		}
		rec["delivery"] = json.RawMessage(`"` + string(DeliveryPerKey) + `"`)
		val, err := json.Marshal(rec)
		if err != nil {
			return false, err
		}
		_, err = kv.Update(ctx, k, val, e.Revision())
		if err == nil {
			return true, nil
		}
		if !isWrongLastSequence(err) {
			return false, err
		}
	}
}
