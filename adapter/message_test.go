package adapter

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// ReadMessage reads back what publishing writes: the key, attributes, id
// and event fields, with every header kept as the Header.
func TestReadMessageReadsWhatPublishWrites(t *testing.T) {
	created := time.Date(2026, 3, 4, 5, 6, 7, 8_000, time.UTC)
	in := &Message{
		OrderingKey: "user/1 é",
		Attributes:  map[string]string{"kind": "a b", "Other": "x"},
		Header:      nats.Header{"Ce-Type": {"t"}},
		UserInfos:   map[string]string{"origin": "h"},
	}
	h := nats.Header{}
	for name, vals := range in.Header {
		h[name] = vals
	}
	writeHeaders(h, in)
	writeMetadata(h, in, created)
	h.Set(headerNatsMsgID, "the-id")

	out := ReadMessage([]byte("data"), h)
	if string(out.Data) != "data" || out.OrderingKey != in.OrderingKey || out.ID != "the-id" {
		t.Fatalf("read %q key %q id %q", out.Data, out.OrderingKey, out.ID)
	}
	if len(out.Attributes) != 2 || out.Attributes["kind"] != "a b" || out.Attributes["Other"] != "x" {
		t.Fatalf("attributes %v", out.Attributes)
	}
	if !out.CreateTime.Equal(created) || out.UserInfos["origin"] != "h" {
		t.Fatalf("event fields: create time %v, user infos %v", out.CreateTime, out.UserInfos)
	}
	if out.Header.Get("Ce-Type") != "t" {
		t.Fatalf("header %v", out.Header)
	}
	if out.StreamSequence != 0 || out.DeliveryAttempt != 0 || !out.PublishTime.IsZero() {
		t.Fatalf("delivery fields set: %+v", out)
	}
}

// A message Receive did not deliver has nothing to hand over, revoke or
// supersede: the methods do nothing, and their channels are never ready.
func TestLayerMethodsOfAnUndeliveredMessage(t *testing.T) {
	for name, m := range map[string]*Message{
		"published": {Data: []byte("x"), OrderingKey: "k"},
		"read":      ReadMessage([]byte("x"), nats.Header{headerOrderingKey: {"k"}}),
	} {
		t.Run(name, func(t *testing.T) {
			m.HandOver()
			if m.Revoked() != nil || m.Superseded() != nil {
				t.Fatal("a channel of an undelivered message is not nil")
			}
		})
	}
}
