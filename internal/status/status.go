// Package status is what the sidecar says about itself on its HTTP port:
// the JSON document of GET /v1/status (Status) and the page at / that
// shows it (Page). The page is plain HTML, CSS and JavaScript embedded in
// the binary; it loads nothing from elsewhere and polls /v1/status.
//
// Lists that could follow the ordering keys in use are bounded (the
// paused keys of a subscription, MaxPausedKeys; the clients, MaxClients),
// so a status with 100,000 active keys costs what one with ten does.
package status

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
	"time"
)

const (
	// MaxPausedKeys bounds Subscription.Paused: the keys with the most
	// deliveries, then the longest held.
	MaxPausedKeys = 20
	// MaxClients bounds Status.Clients.
	MaxClients = 100
	// PausedAttempt is the delivery attempt from which a key counts as
	// paused: its message has been delivered that many times without an
	// ack, and the key's next message waits behind it.
	PausedAttempt = 3
	// RecentWindow is the span of the recent counts
	// (Subscription.RedeliveredRecent, DeadLetteredRecent).
	RecentWindow = 5 * time.Minute
)

// Status is the sidecar's state, as GET /v1/status returns it.
type Status struct {
	Time    time.Time `json:"time"`
	Sidecar Sidecar   `json:"sidecar"`
	NATS    NATS      `json:"nats"`
	// JetStream says how the figures read from JetStream (topics,
	// backlogs, partitions) were read, and when.
	JetStream     JetStream      `json:"jetstream"`
	Topics        []Topic        `json:"topics"`
	Subscriptions []Subscription `json:"subscriptions"`
	// Streams counts the open StreamingPull streams, Clients lists them
	// (at most MaxClients, the oldest first; ClientsOmitted the others).
	Streams        int      `json:"streams"`
	Clients        []Client `json:"clients"`
	ClientsOmitted int      `json:"clients_omitted"`
}

// Sidecar is the process.
type Sidecar struct {
	Started       time.Time `json:"started"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	GoVersion     string    `json:"go_version"`
	Goroutines    int       `json:"goroutines"`
}

// NATS is the sidecar's NATS connection.
type NATS struct {
	// Status is nats.go's: CONNECTED, RECONNECTING, DISCONNECTED, CLOSED, ...
	Status    string `json:"status"`
	Connected bool   `json:"connected"`
	// Embedded is true when the server is the sidecar's own, in this
	// process (the URL is then the one it would listen on, if asked to).
	Embedded bool `json:"embedded"`
	// URL is the server connected to, without credentials ("" when none).
	URL           string  `json:"url"`
	ServerName    string  `json:"server_name"`
	ServerVersion string  `json:"server_version"`
	Reconnects    uint64  `json:"reconnects"`
	RTTMillis     float64 `json:"rtt_ms"` // at the last JetStream read; 0 when unknown
	// Sync says when the server's writes reach disk, as far as the
	// sidecar knows; SyncRisk is true when an acknowledged publish may be
	// lost in a power cut (docs/RELIABILITY.md, "Power cuts").
	Sync     string `json:"sync"`
	SyncRisk bool   `json:"sync_risk"`
}

// JetStream is the account's JetStream, as last read.
type JetStream struct {
	// OK is whether the last read succeeded; Error says why not.
	OK    bool   `json:"ok"`
	Error string `json:"error,omitempty"`
	// AsOf is when the last read that succeeded began; the figures of
	// Topics, and a subscription's backlog and partitions, are of then.
	// They are read at most once a second, while someone asks.
	AsOf       time.Time `json:"as_of"`
	ReadMillis float64   `json:"read_ms"` // how long that read took
	Streams    int       `json:"streams"`
	Consumers  int       `json:"consumers"`
	// Storage and memory used by the account's streams, in bytes.
	StorageBytes uint64 `json:"storage_bytes"`
	MemoryBytes  uint64 `json:"memory_bytes"`
}

// Topic is one topic's stream.
type Topic struct {
	Name      string `json:"name"` // projects/P/topics/T
	Messages  uint64 `json:"messages"`
	Bytes     uint64 `json:"bytes"`
	Consumers int    `json:"consumers"`
	// LastStored is when the newest message was stored; absent when none.
	LastStored *time.Time `json:"last_stored,omitempty"`
}

// Subscription is one subscription: what JetStream holds for it, across
// every receiver, and what this sidecar holds of it.
type Subscription struct {
	Name  string `json:"name"`  // projects/P/subscriptions/S
	Topic string `json:"topic"` // projects/P/topics/T, or _deleted-topic_
	// Delivery is "unordered", "per-key" or "partitioned".
	Delivery string `json:"delivery"`
	// PushEndpoint is a push subscription's endpoint, without its query.
	PushEndpoint string `json:"push_endpoint,omitempty"`
	Detached     bool   `json:"detached,omitempty"`

	// Backlog is the messages not yet acked, delivered or not, as the
	// subscription's JetStream consumers count them; Unacked those of them
	// delivered and waiting for an ack (or redelivery). With per-key
	// delivery the backlog of keyed messages is the larger of the key
	// consumers' count and the keyed messages after the discovery floor
	// (those no consumer may cover yet): exact unless some of those keys
	// have a consumer and others not.
	Backlog uint64 `json:"backlog"`
	Unacked uint64 `json:"unacked"`
	// OldestUnackedAgeSeconds is the age of the oldest message not acked,
	// 0 when there is none; OldestUnacked is when it was stored.
	OldestUnackedAgeSeconds float64    `json:"oldest_unacked_age_seconds"`
	OldestUnacked           *time.Time `json:"oldest_unacked,omitempty"`
	Consumers               int        `json:"consumers"` // JetStream consumers
	// JetStreamRead is whether the last JetStream read included the
	// subscription: otherwise its backlog is not known yet.
	JetStreamRead bool `json:"-"`

	// Partitions of a partitioned subscription.
	Partitions []Partition `json:"partitions,omitempty"`

	// What this sidecar holds. Receiving: it runs a Receive of the
	// subscription (a client is attached, or was within 30 s, or it
	// pushes the subscription).
	Receiving bool `json:"receiving"`
	Streams   int  `json:"streams"` // StreamingPull streams attached
	// Outstanding is the messages with clients, not yet settled.
	Outstanding int `json:"outstanding"`
	// KeysInFlight is the ordering keys with a message held here: with a
	// client, or waiting for one.
	KeysInFlight int `json:"keys_in_flight"`
	// MaxDeliveryAttempt is the highest delivery attempt among the
	// messages held here.
	MaxDeliveryAttempt int `json:"max_delivery_attempt"`
	// PausedKeys counts the keys whose message held here has been
	// delivered PausedAttempt times or more: each holds back its key.
	// Paused lists at most MaxPausedKeys of them.
	PausedKeys int         `json:"paused_keys"`
	Paused     []PausedKey `json:"paused"`
	// PartitionsOwned is the partitions this sidecar owns;
	// PartitionBuffered the unacked messages they hold; PartitionsFull
	// those whose buffer is full (nothing more of them is delivered until
	// a message is acked).
	PartitionsOwned   int `json:"partitions_owned"`
	PartitionBuffered int `json:"partition_buffered"`
	PartitionsFull    int `json:"partitions_full"`
	// Redeliveries by this sidecar, and messages it moved to the
	// dead-letter topic, in the last RecentWindow.
	RedeliveredRecent  int `json:"redelivered_recent"`
	DeadLetteredRecent int `json:"dead_lettered_recent"`
	// DIDCommOpenGaps is the orders missing in the threads this sidecar's
	// DIDComm tracker holds; absent unless the subscription is tracked.
	DIDCommOpenGaps *int `json:"didcomm_open_gaps,omitempty"`
}

// Partition is one partition of a partitioned subscription.
type Partition struct {
	Index int `json:"partition"`
	// Owner is "this sidecar", "other" (another receiver, in this process
	// or another: PinID and PinnedSince say which and since when) or ""
	// (none: the next receiver to ask takes it).
	Owner string `json:"owner"`
	PinID string `json:"pin_id,omitempty"`
	// Holder names the sidecar (--name) whose receiver owns the
	// partition, this one or another; "" when not known.
	Holder      string     `json:"holder,omitempty"`
	PinnedSince *time.Time `json:"pinned_since,omitempty"`
	Pending     uint64     `json:"pending"` // not yet delivered
	Unacked     uint64     `json:"unacked"` // delivered, not yet acked
}

// UnownedPartitions counts the partitions holding messages (pending or
// unacked) to which JetStream has pinned no receiver: nobody delivers
// them. The server pins a partition on its first delivery to a receiver
// that pulls it, so one that holds nothing has no pin and is not counted,
// and one that has messages and no pin for more than a moment has no
// receiver pulling it. It counts what JetStream says, whatever this
// sidecar's receivers believe they own.
func (s *Subscription) UnownedPartitions() int {
	n := 0
	for _, p := range s.Partitions {
		if p.PinID == "" && p.Pending+p.Unacked > 0 {
			n++
		}
	}
	return n
}

// PausedKey is a key stuck on redeliveries.
type PausedKey struct {
	Key             string  `json:"key"`
	MessageID       string  `json:"message_id"`
	DeliveryAttempt int     `json:"delivery_attempt"`
	HeldSeconds     float64 `json:"held_seconds"` // since this delivery reached the sidecar
}

// Client is one open StreamingPull stream.
type Client struct {
	Peer         string    `json:"peer"` // the client's address
	UserAgent    string    `json:"user_agent"`
	Subscription string    `json:"subscription"`
	Since        time.Time `json:"since"`
	Outstanding  int       `json:"outstanding"` // messages it holds unsettled
}

//go:embed page
var page embed.FS

// Page serves the status page: GET / and its files under /status/
// (status.js, status.css); other paths are not found. The page polls
// /v1/status, which its server must serve.
var Page http.Handler = pageHandler()

func pageHandler() http.Handler {
	sub, err := fs.Sub(page, "page")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Nothing from elsewhere, and nothing inline: the page is its
		// three files.
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		file, ok := strings.CutPrefix(r.URL.Path, "/status/")
		if !ok && r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path, r2.URL.RawPath = "/"+file, ""
		files.ServeHTTP(w, r2)
	})
}
