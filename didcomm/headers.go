package didcomm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/keyrouter"
)

// PlaintextMediaType is the media type of DIDComm plaintext messages. A
// message whose Content-Type header says so is read as DIDComm even
// without a "type" member, and its header errors are reported.
const PlaintextMediaType = "application/didcomm-plain+json"

// NATS header names that carry the sequencing headers beside a payload that
// is not a DIDComm plaintext message (docs/WIRE.md).
const (
	HeaderID             = "Didcomm-Id"
	HeaderThread         = "Didcomm-Thid"
	HeaderFrom           = "Didcomm-From"
	HeaderSenderOrder    = "Didcomm-Sender-Order"
	HeaderSentCount      = "Didcomm-Sent-Count"
	HeaderReceivedOrders = "Didcomm-Received-Orders"
)

// Pub/Sub attribute names that carry the sequencing headers beside a
// payload that is not a DIDComm plaintext message, on messages published
// through the sidecar: the NATS header names lower-cased, read in any case,
// with plain UTF-8 values (attributes need no percent-encoding).
const (
	AttrID             = "didcomm-id"
	AttrThread         = "didcomm-thid"
	AttrFrom           = "didcomm-from"
	AttrSenderOrder    = "didcomm-sender-order"
	AttrSentCount      = "didcomm-sent-count"
	AttrReceivedOrders = "didcomm-received-orders"
)

// ErrNotDIDComm is returned by Read for a message that carries neither
// Didcomm- NATS headers nor a DIDComm plaintext JSON object (one with
// string "id" and "type" members). Receive hands such messages over
// untracked, without an error.
var ErrNotDIDComm = errors.New("didcomm: not a DIDComm message")

// Headers are the sequencing headers of one DIDComm message.
type Headers struct {
	// ID is the message id; a resend repeats it.
	ID string
	// Thread is thid. Empty means the message starts its own thread, whose
	// id is ID.
	Thread string
	// From is the sender (a DID).
	From string
	// SenderOrder is the sender's order of the message in the thread,
	// 1, 2, 3, ... Zero means absent: the message is not sequenced.
	SenderOrder uint64
	// SentCount is 2, 3, ... on resends; 0 or 1 is the first send, on the
	// wire as no header at all.
	SentCount uint64
	// ReceivedOrders is how the sender has seen the thread so far; nil when
	// absent.
	ReceivedOrders []ReceivedOrder
}

// ThreadID is the id of the message's thread: thid, or the message's own
// id when it has no thid.
func (h *Headers) ThreadID() string {
	if h.Thread != "" {
		return h.Thread
	}
	return h.ID
}

// Sequenced reports whether the message carries a sender_order.
func (h *Headers) Sequenced() bool { return h.SenderOrder != 0 }

// Resend marks the headers of a message about to be sent again: the id,
// sender_order and body stay, sent_count grows by one (2 on the first
// resend).
func (h *Headers) Resend() {
	if h.SentCount < 1 {
		h.SentCount = 1
	}
	h.SentCount++
}

// validate checks what tracking a sequenced message needs.
func (h *Headers) validate() error {
	if !h.Sequenced() {
		return ErrNotSequenced
	}
	if h.ID == "" {
		return ErrMissingID
	}
	if h.From == "" {
		return ErrMissingSender
	}
	return nil
}

// ReceivedOrder is one gap detector of a received_orders header.
type ReceivedOrder struct {
	// ID is the party (its DID).
	ID string `json:"id"`
	// Last is the largest sender_order seen from the party.
	Last uint64 `json:"last"`
	// Gaps are the orders below Last not seen, ascending. A tracker lists
	// at most its MaxRenderedGaps of them, the lowest first.
	Gaps []uint64 `json:"gaps"`
	// GapsOmitted counts the missing orders Gaps does not list because of
	// that cap; absent (0) when Gaps lists them all. Not in the
	// specification: receivers that do not know it ignore it.
	GapsOmitted uint64 `json:"gaps_omitted,omitempty"`
}

// Read reads the sequencing headers of a delivered message: from its
// Didcomm- NATS headers when it has any, otherwise from its didcomm-*
// attributes when it has any, otherwise from its payload when that is a
// DIDComm plaintext JSON message. It returns ErrNotDIDComm for anything
// else.
func Read(m *adapter.Message) (Headers, error) {
	if h, ok, err := ReadHeader(m.Header); ok || err != nil {
		return h, err
	}
	if h, ok, err := ReadAttributes(m.Attributes); ok || err != nil {
		return h, err
	}
	strict := m.Header.Get("Content-Type") == PlaintextMediaType
	if !strict && !bytes.HasPrefix(bytes.TrimLeft(m.Data, " \t\r\n"), []byte("{")) {
		return Headers{}, ErrNotDIDComm // not JSON: no need to parse it
	}
	members, err := plaintextMembers(m.Data)
	if err != nil {
		if strict {
			return Headers{}, err
		}
		return Headers{}, ErrNotDIDComm
	}
	if !strict && (!isJSONString(members["id"]) || !isJSONString(members["type"])) {
		return Headers{}, ErrNotDIDComm
	}
	return headersOf(members)
}

// ReadPlaintext reads the sequencing headers of a DIDComm plaintext JSON
// message. Absent headers are zero; malformed ones are an error.
func ReadPlaintext(data []byte) (Headers, error) {
	members, err := plaintextMembers(data)
	if err != nil {
		return Headers{}, err
	}
	return headersOf(members)
}

// WritePlaintext returns the DIDComm plaintext message data with h's
// headers written as its top-level members: id, thid and from when not
// empty; sender_order and received_orders when set, removed otherwise;
// sent_count when above 1, removed otherwise (absence means 1). Other
// members, the body included, keep their values.
func WritePlaintext(data []byte, h Headers) ([]byte, error) {
	members, err := plaintextMembers(data)
	if err != nil {
		return nil, err
	}
	for name, v := range map[string]string{"id": h.ID, "thid": h.Thread, "from": h.From} {
		if v != "" {
			b, _ := json.Marshal(v)
			members[name] = b
		}
	}
	setOrDelete := func(name string, ok bool, v any) {
		if !ok {
			delete(members, name)
			return
		}
		b, _ := json.Marshal(v)
		members[name] = b
	}
	setOrDelete("sender_order", h.SenderOrder > 0, h.SenderOrder)
	setOrDelete("sent_count", h.SentCount > 1, h.SentCount)
	setOrDelete("received_orders", h.ReceivedOrders != nil, renderable(h.ReceivedOrders))
	return json.Marshal(members)
}

// ReadHeader reads the sequencing headers from Didcomm- NATS headers. ok
// is false when there are none.
func ReadHeader(nh nats.Header) (h Headers, ok bool, err error) {
	return readFields(HeaderID, func(name string) (string, bool) {
		if vals, ok := nh[name]; ok {
			return firstOf(vals), true
		}
		for n, vals := range nh {
			if strings.EqualFold(n, name) {
				return firstOf(vals), true
			}
		}
		return "", false
	}, keyrouter.DecodeKey)
}

// ReadAttributes reads the sequencing headers from the didcomm-* attributes
// of a Pub/Sub message (AttrID, ...). ok is false when there are none.
func ReadAttributes(attrs map[string]string) (h Headers, ok bool, err error) {
	return readFields(AttrID, func(name string) (string, bool) {
		if v, ok := attrs[name]; ok {
			return v, true
		}
		for n, v := range attrs {
			if strings.EqualFold(n, name) {
				return v, true
			}
		}
		return "", false
	}, func(s string) (string, error) { return s, nil })
}

// readFields reads the sequencing headers through get, which finds a
// field by its NATS header name in any case (the attribute names are the
// same, lower-cased). decode reads id, thid and from. The first argument
// names the id field in errors' terms.
func readFields(idName string, get func(name string) (string, bool), decode func(string) (string, error)) (h Headers, ok bool, err error) {
	names := []string{HeaderID, HeaderThread, HeaderFrom, HeaderSenderOrder, HeaderSentCount, HeaderReceivedOrders}
	for _, name := range names {
		if _, present := get(name); present {
			ok = true
			break
		}
	}
	if !ok {
		return Headers{}, false, nil
	}
	shown := func(name string) string {
		if idName == AttrID {
			return strings.ToLower(name)
		}
		return name
	}
	for name, dst := range map[string]*string{HeaderID: &h.ID, HeaderThread: &h.Thread, HeaderFrom: &h.From} {
		if v, _ := get(name); v != "" {
			if *dst, err = decode(v); err != nil {
				return Headers{}, true, fmt.Errorf("%w: %s: %v", ErrInvalidHeader, shown(name), err)
			}
		}
	}
	if v, present := get(HeaderSenderOrder); present {
		if h.SenderOrder, err = parseNatural(v); err != nil {
			return Headers{}, true, fmt.Errorf("%w: %s %q: %v", ErrInvalidSenderOrder, shown(HeaderSenderOrder), v, err)
		}
	}
	if v, present := get(HeaderSentCount); present {
		if h.SentCount, err = parseNatural(v); err != nil {
			return Headers{}, true, fmt.Errorf("%w: %s %q: %v", ErrInvalidSentCount, shown(HeaderSentCount), v, err)
		}
	}
	if v, present := get(HeaderReceivedOrders); present {
		if h.ReceivedOrders, err = ParseReceivedOrders([]byte(v)); err != nil {
			return Headers{}, true, err
		}
	}
	return h, true, nil
}

// WriteHeader writes h as Didcomm- NATS headers, for a payload that is not
// a DIDComm plaintext message. id, thid and from are percent-encoded as
// ordering keys are (docs/WIRE.md).
func WriteHeader(nh nats.Header, h Headers) {
	for name, v := range map[string]string{HeaderID: h.ID, HeaderThread: h.Thread, HeaderFrom: h.From} {
		if v != "" {
			nh.Set(name, keyrouter.EncodeKey(v))
		} else {
			nh.Del(name)
		}
	}
	nh.Del(HeaderSenderOrder)
	if h.SenderOrder > 0 {
		nh.Set(HeaderSenderOrder, strconv.FormatUint(h.SenderOrder, 10))
	}
	nh.Del(HeaderSentCount)
	if h.SentCount > 1 {
		nh.Set(HeaderSentCount, strconv.FormatUint(h.SentCount, 10))
	}
	nh.Del(HeaderReceivedOrders)
	if h.ReceivedOrders != nil {
		b, _ := json.Marshal(renderable(h.ReceivedOrders))
		nh.Set(HeaderReceivedOrders, string(b))
	}
}

// WriteAttributes writes h as didcomm-* attributes into attrs, the form
// of Pub/Sub messages whose payload is not a DIDComm plaintext message:
// as WriteHeader, with plain values. Attributes of the same names in
// another case are removed.
func WriteAttributes(attrs map[string]string, h Headers) {
	for name := range attrs {
		if len(name) > len("didcomm-") && strings.EqualFold(name[:len("didcomm-")], "didcomm-") && name != strings.ToLower(name) {
			for _, canon := range []string{AttrID, AttrThread, AttrFrom, AttrSenderOrder, AttrSentCount, AttrReceivedOrders} {
				if strings.EqualFold(name, canon) {
					delete(attrs, name)
				}
			}
		}
	}
	set := func(name, v string, ok bool) {
		if ok {
			attrs[name] = v
		} else {
			delete(attrs, name)
		}
	}
	set(AttrID, h.ID, h.ID != "")
	set(AttrThread, h.Thread, h.Thread != "")
	set(AttrFrom, h.From, h.From != "")
	set(AttrSenderOrder, strconv.FormatUint(h.SenderOrder, 10), h.SenderOrder > 0)
	set(AttrSentCount, strconv.FormatUint(h.SentCount, 10), h.SentCount > 1)
	ros, _ := json.Marshal(renderable(h.ReceivedOrders))
	set(AttrReceivedOrders, string(ros), h.ReceivedOrders != nil)
}

// ParseReceivedOrders parses a received_orders value. Each entry needs a
// non-empty string id, a last >= 1, and gaps that are distinct whole
// numbers in 1..last-1 (returned ascending). Unknown members are ignored.
func ParseReceivedOrders(data []byte) ([]ReceivedOrder, error) {
	var entries []map[string]json.RawMessage
	if err := json.Unmarshal(data, &entries); err != nil || entries == nil {
		return nil, fmt.Errorf("%w: not a JSON array of objects", ErrInvalidReceivedOrders)
	}
	out := make([]ReceivedOrder, 0, len(entries))
	for i, e := range entries {
		var ro ReceivedOrder
		if err := json.Unmarshal(e["id"], &ro.ID); err != nil || ro.ID == "" || !isJSONString(e["id"]) {
			return nil, fmt.Errorf("%w: entry %d: id must be a non-empty string", ErrInvalidReceivedOrders, i)
		}
		last, err := parseNatural(string(e["last"]))
		if err != nil {
			return nil, fmt.Errorf("%w: entry %d (%s): last: %v", ErrInvalidReceivedOrders, i, ro.ID, err)
		}
		ro.Last = last
		var gaps []json.RawMessage
		if raw, ok := e["gaps"]; ok {
			if err := json.Unmarshal(raw, &gaps); err != nil {
				return nil, fmt.Errorf("%w: entry %d (%s): gaps must be an array", ErrInvalidReceivedOrders, i, ro.ID)
			}
		}
		ro.Gaps = make([]uint64, 0, len(gaps))
		for _, g := range gaps {
			n, err := parseNatural(string(g))
			if err != nil || n >= last {
				return nil, fmt.Errorf("%w: entry %d (%s): gap %.40s is not a whole number in 1..%d", ErrInvalidReceivedOrders, i, ro.ID, g, last-1)
			}
			ro.Gaps = append(ro.Gaps, n)
		}
		slices.Sort(ro.Gaps)
		if len(slices.Compact(slices.Clone(ro.Gaps))) != len(ro.Gaps) {
			return nil, fmt.Errorf("%w: entry %d (%s): a gap is listed twice", ErrInvalidReceivedOrders, i, ro.ID)
		}
		if raw, ok := e["gaps_omitted"]; ok {
			if ro.GapsOmitted, err = parseCount(string(raw)); err != nil {
				return nil, fmt.Errorf("%w: entry %d (%s): gaps_omitted: %v", ErrInvalidReceivedOrders, i, ro.ID, err)
			}
		}
		out = append(out, ro)
	}
	return out, nil
}

// renderable makes every entry's gaps render as [] rather than null.
func renderable(ros []ReceivedOrder) []ReceivedOrder {
	out := make([]ReceivedOrder, len(ros))
	for i, ro := range ros {
		if ro.Gaps == nil {
			ro.Gaps = []uint64{}
		}
		out[i] = ro
	}
	return out
}

// plaintextMembers splits a JSON object into its top-level members. Names
// are matched exactly: DIDComm headers are case-sensitive.
func plaintextMembers(data []byte) (map[string]json.RawMessage, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil || members == nil {
		return nil, fmt.Errorf("%w: plaintext message is not a JSON object", ErrInvalidHeader)
	}
	return members, nil
}

// headersOf reads the sequencing headers out of a plaintext message's
// members.
func headersOf(members map[string]json.RawMessage) (h Headers, err error) {
	for name, raw := range members {
		if bytes.Equal(raw, []byte("null")) {
			delete(members, name) // null is absent, for every header
		}
	}
	for name, dst := range map[string]*string{"id": &h.ID, "thid": &h.Thread, "from": &h.From} {
		raw, ok := members[name]
		if !ok {
			continue
		}
		if !isJSONString(raw) || json.Unmarshal(raw, dst) != nil {
			return Headers{}, fmt.Errorf("%w: %s must be a string, got %.40s", ErrInvalidHeader, name, raw)
		}
	}
	if raw, ok := members["sender_order"]; ok {
		if h.SenderOrder, err = parseNatural(string(raw)); err != nil {
			return Headers{}, fmt.Errorf("%w: %.40s: %v", ErrInvalidSenderOrder, raw, err)
		}
	}
	if raw, ok := members["sent_count"]; ok {
		if h.SentCount, err = parseNatural(string(raw)); err != nil {
			return Headers{}, fmt.Errorf("%w: %.40s: %v", ErrInvalidSentCount, raw, err)
		}
	}
	if raw, ok := members["received_orders"]; ok {
		if h.ReceivedOrders, err = ParseReceivedOrders(raw); err != nil {
			return Headers{}, err
		}
	}
	return h, nil
}

// parseNatural accepts a plain decimal literal >= 1 that fits in uint64:
// no sign, fraction, exponent, quotes or leading zeros.
func parseNatural(s string) (uint64, error) {
	n, err := parseCount(s)
	if err == nil && n == 0 {
		return 0, errors.New("must be at least 1")
	}
	return n, err
}

// parseCount is parseNatural that also accepts 0.
func parseCount(s string) (uint64, error) {
	if s == "" {
		return 0, errors.New("empty")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errors.New("not a whole number")
		}
	}
	if len(s) > 1 && s[0] == '0' {
		return 0, errors.New("leading zero")
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, errors.New("too large")
	}
	return n, nil
}

func isJSONString(raw json.RawMessage) bool { return len(raw) > 0 && raw[0] == '"' }

func firstOf(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}
