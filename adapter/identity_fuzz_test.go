package adapter

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/internal/rsb"
	"github.com/jetorder/jetorder/internal/testutil"
	"github.com/jetorder/jetorder/keyrouter"
)

// FuzzReadMetadata checks the headers a publisher writes and delivery
// reads (docs/WIRE.md):
//   - what writeHeaders, writeMetadata and sequencer.stamp write survives the
//     NATS wire unchanged and reads back as the message that was published;
//   - a header added or replaced by another writer (any name, any value)
//     changes at most the field that header names, never panics, and what
//     it yields is what the header says or the zero value.
func FuzzReadMetadata(f *testing.F) {
	sender := uuid.MustParse("D8FBFEF4-4EB0-4C89-9716-C425DED3C527")
	created := time.Date(2026, 11, 21, 9, 0, 0, 123456789, time.UTC).UnixNano()
	f.Add("user-123", "origin", "eu-west", "sensor read", "a b\r\nc", created, uint32(0), sender[:], uint8(1), "X-Trace", "abc")
	f.Add("a.*.>", "k%41", "%", "é", "\x00", int64(0), uint32(4294967295), []byte{}, uint8(3), headerSequence, "4294967296")
	f.Add("", "origin", "", "k", "", int64(-1), uint32(378), sender[:8], uint8(0), headerAttrPrefix+"%6Frigin", "%zz")
	f.Fuzz(func(t *testing.T, key, attrKey, attrVal, userKey, userInfo string, createNanos int64, seq uint32, senderBytes []byte, causes uint8, name, value string) {
		var senderID uuid.UUID
		copy(senderID[:], senderBytes)
		in := &Message{
			OrderingKey: key,
			CreateTime:  time.Unix(0, createNanos),
			Attributes:  map[string]string{attrKey: attrVal},
			UserTimes:   map[string]time.Time{userKey: time.Unix(0, createNanos/3)},
			UserInfos:   map[string]string{userKey: userInfo},
		}
		for i := range int(causes % 4) {
			in.Causes = append(in.Causes, uuid.MustParse(rsb.MessageID(senderID, uint32(i))))
		}
		if !publishable(in) {
			return
		}
		sent := time.Unix(0, createNanos).Add(time.Millisecond)
		h := nats.Header{}
		writeHeaders(h, in)
		writeMetadata(h, in, in.CreateTime)
		id := (&sequencer{sender: senderID, next: seq}).stamp(h)
		writeSendTime(h, sendTime(sent))

		wire := testutil.NATSWire(t, h)
		var out Message
		readHeaders(wire, &out)
		want := Message{
			ID: id, OrderingKey: key, Attributes: in.Attributes, SenderID: senderID, SequenceNumber: seq,
			CreateTime: utcMicros(in.CreateTime), SendTime: utcMicros(sent), Causes: in.Causes,
			UserTimes: map[string]time.Time{userKey: utcMicros(in.UserTimes[userKey])}, UserInfos: in.UserInfos,
		}
		if diff := metadataDiff(&out, &want); diff != "" {
			t.Fatalf("round trip through the wire changed %s", diff)
		}

		// Another writer's header: only the field it names may change.
		h[name] = []string{value}
		var got Message
		readHeaders(h, &got)
		for _, tm := range append([]time.Time{got.CreateTime, got.SendTime}, slices.Collect(maps.Values(got.UserTimes))...) {
			if !tm.IsZero() && tm.Location() != time.UTC {
				t.Fatalf("header %q: %q: read a time %v not in UTC", name, value, tm)
			}
		}
		field := fieldOfHeader(name)
		for f, v := range metadataFields(&got) {
			if f != field && !reflect.DeepEqual(v, metadataFields(&out)[f]) {
				t.Fatalf("header %q: %q changed %s from %v to %v, which it does not name", name, value, f, metadataFields(&out)[f], v)
			}
		}
		if msg := fieldReadsHeader(&got, &out, field, name, value); msg != "" {
			t.Fatalf("header %q: %q: %s", name, value, msg)
		}
	})
}

// publishable reports whether Publish would take in's headers.
func publishable(in *Message) bool {
	if in.OrderingKey != "" && keyrouter.ValidateOrderingKey(in.OrderingKey) != nil {
		return false
	}
	if validateAttributes(in.Attributes) != nil || validateMetadata(in) != nil {
		return false
	}
	// RFC 3339 has four-digit years.
	for _, tm := range append([]time.Time{in.CreateTime}, slices.Collect(maps.Values(in.UserTimes))...) {
		if y := tm.UTC().Year(); y < 0 || y > 9999 {
			return false
		}
	}
	return true
}

func utcMicros(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

func metadataFields(m *Message) map[string]any {
	return map[string]any{
		"key": m.OrderingKey, "id": m.ID, "attributes": m.Attributes, "sender": m.SenderID, "sequence": m.SequenceNumber,
		"create time": m.CreateTime, "send time": m.SendTime, "causes": m.Causes, "user times": m.UserTimes, "user infos": m.UserInfos,
	}
}

func metadataDiff(got, want *Message) string {
	w := metadataFields(want)
	for f, v := range metadataFields(got) {
		if !reflect.DeepEqual(v, w[f]) {
			return fmt.Sprintf("%s: got %#v, want %#v", f, v, w[f])
		}
	}
	return ""
}

// fieldOfHeader is the Message field a header name is read into, "" for
// none. Names are case-sensitive, as on the NATS wire.
func fieldOfHeader(name string) string {
	switch {
	case name == headerOrderingKey:
		return "key"
	case name == headerNatsMsgID:
		return "id"
	case name == headerSenderID:
		return "sender"
	case name == headerSequence:
		return "sequence"
	case name == headerCreateTime:
		return "create time"
	case name == headerSendTime:
		return "send time"
	case name == headerCause:
		return "causes"
	case strings.HasPrefix(name, headerAttrPrefix):
		return "attributes"
	case strings.HasPrefix(name, headerUserTimePfx):
		return "user times"
	case strings.HasPrefix(name, headerUserInfoPfx):
		return "user infos"
	}
	return ""
}

// fieldReadsHeader checks that the field a header names holds what the
// header says, or its zero value when the header cannot be read; for the
// maps, only the entry the header names may differ from before.
func fieldReadsHeader(got, before *Message, field, name, value string) string {
	switch field {
	case "key":
		if k, err := keyrouter.DecodeKey(value); got.OrderingKey != "" && (err != nil || k != got.OrderingKey) {
			return "ordering key " + strconv.Quote(got.OrderingKey) + " is not what the header encodes"
		}
	case "id":
		if got.ID != value {
			return "message id " + strconv.Quote(got.ID) + " is not the header"
		}
	case "sender":
		if id, err := uuid.Parse(value); got.SenderID != uuid.Nil && (err != nil || id != got.SenderID) {
			return "sender " + got.SenderID.String() + " is not the header"
		}
	case "sequence":
		if n, err := strconv.ParseUint(value, 10, 32); got.SequenceNumber != 0 && (err != nil || uint32(n) != got.SequenceNumber) {
			return "sequence number " + strconv.Itoa(int(got.SequenceNumber)) + " is not the header"
		}
	case "create time", "send time":
		tm := got.CreateTime
		if field == "send time" {
			tm = got.SendTime
		}
		if p, err := time.Parse(time.RFC3339Nano, value); !tm.IsZero() && (err != nil || !p.Equal(tm)) {
			return field + " " + tm.String() + " is not the header"
		}
	case "causes":
		if len(got.Causes) > strings.Count(value, ",")+1 {
			return strconv.Itoa(len(got.Causes)) + " causes from " + strconv.Itoa(strings.Count(value, ",")+1) + " comma-separated values"
		}
		// uuid.Parse takes the 36-character form, urn:uuid:, braces
		// and 32 bare hex digits: each holds the digits in order.
		digits := strings.ToLower(strings.ReplaceAll(value, "-", ""))
		for _, c := range got.Causes {
			if !strings.Contains(digits, strings.ReplaceAll(c.String(), "-", "")) {
				return "cause " + c.String() + " is not in the header"
			}
		}
	case "attributes":
		return mapEntryReadsHeader(got.Attributes, before.Attributes, name[len(headerAttrPrefix):], value, keyrouter.DecodeKey)
	case "user infos":
		return mapEntryReadsHeader(got.UserInfos, before.UserInfos, name[len(headerUserInfoPfx):], value, keyrouter.DecodeKey)
	case "user times":
		return mapEntryReadsHeader(got.UserTimes, before.UserTimes, name[len(headerUserTimePfx):], value, func(s string) (time.Time, error) {
			return time.Parse(time.RFC3339Nano, s)
		})
	}
	return ""
}

// mapEntryReadsHeader: every entry but the one the header names is as
// before; that one is absent, as before, or the header's decoded value.
func mapEntryReadsHeader[V any](got, before map[string]V, encodedKey, value string, decode func(string) (V, error)) string {
	k, kerr := keyrouter.DecodeKey(encodedKey)
	for gk, gv := range got {
		if kerr == nil && gk == k {
			bv, had := before[gk]
			dv, derr := decode(value)
			if !(had && reflect.DeepEqual(gv, bv)) && (derr != nil || !equalValue(gv, dv)) {
				return "entry " + strconv.Quote(gk) + " is neither as before nor the header's value"
			}
			continue
		}
		if bv, ok := before[gk]; !ok || !reflect.DeepEqual(gv, bv) {
			return "entry " + strconv.Quote(gk) + " changed, which the header does not name"
		}
	}
	for bk := range before {
		if _, ok := got[bk]; !ok && (kerr != nil || bk != k) {
			return "entry " + strconv.Quote(bk) + " lost, which the header does not name"
		}
	}
	return ""
}

func equalValue[V any](a, b V) bool {
	if ta, ok := any(a).(time.Time); ok {
		return ta.Equal(any(b).(time.Time))
	}
	return reflect.DeepEqual(a, b)
}
