package didcomm

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/adapter"
)

const plainBid = `{"id":"bid-2","type":"https://example.org/auction/1.0/bid","thid":"auction-7","from":"did:ex:alice","to":["did:ex:auctioneer"],"body":{"amount":  120,"note":"second"}}`

func TestPlaintextRoundTrip(t *testing.T) {
	h, err := ReadPlaintext([]byte(plainBid))
	if err != nil {
		t.Fatal(err)
	}
	if h.ID != "bid-2" || h.Thread != "auction-7" || h.From != "did:ex:alice" || h.Sequenced() {
		t.Fatalf("read %+v", h)
	}
	seq := NewSequencer()
	if err := seq.Stamp(&h); err != nil {
		t.Fatal(err)
	}
	h.ReceivedOrders = []ReceivedOrder{{ID: "did:ex:bob", Last: 2}}
	first, err := WritePlaintext([]byte(plainBid), h)
	if err != nil {
		t.Fatal(err)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(first, &members); err != nil {
		t.Fatal(err)
	}
	if string(members["sender_order"]) != "1" || members["sent_count"] != nil || string(members["received_orders"]) != `[{"id":"did:ex:bob","last":2,"gaps":[]}]` {
		t.Fatalf("written %s", first)
	}
	if string(members["body"]) != `{"amount":120,"note":"second"}` || string(members["to"]) != `["did:ex:auctioneer"]` {
		t.Fatalf("other members changed: %s", first)
	}
	// A resend: same id, order and body; sent_count 2.
	h.Resend()
	second, err := WritePlaintext(first, h)
	if err != nil {
		t.Fatal(err)
	}
	back, err := ReadPlaintext(second)
	if err != nil {
		t.Fatal(err)
	}
	if back.ID != "bid-2" || back.SenderOrder != 1 || back.SentCount != 2 {
		t.Fatalf("resend read back as %+v", back)
	}
	if !bytes.Equal(bytes.Replace(second, []byte(`"sent_count":2,`), nil, 1), first) {
		t.Fatalf("resend differs beyond sent_count:\n%s\n%s", first, second)
	}
}

func TestNATSHeaderRoundTrip(t *testing.T) {
	want := Headers{ID: "m 1\n", Thread: "thread.x", From: "did:ex:ü", SenderOrder: 7, SentCount: 3,
		ReceivedOrders: []ReceivedOrder{{ID: "did:ex:bob", Last: 4, Gaps: []uint64{2, 3}, GapsOmitted: 5}}}
	nh := nats.Header{}
	WriteHeader(nh, want)
	for name, vals := range nh {
		if strings.ContainsAny(vals[0], "\r\n") {
			t.Fatalf("header %s holds a line break: %q", name, vals[0])
		}
	}
	got, ok, err := ReadHeader(nh)
	if err != nil || !ok {
		t.Fatal(ok, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	// Through Read, as Receive sees it: NATS headers win over the payload.
	got, err = Read(&adapter.Message{Header: nh, Data: []byte(plainBid)})
	if err != nil || got.ID != want.ID {
		t.Fatalf("Read: %+v, %v", got, err)
	}
	// A first send carries no sent_count header.
	WriteHeader(nh, Headers{ID: "m", From: "a", SenderOrder: 1, SentCount: 1})
	if _, ok := nh[HeaderSentCount]; ok {
		t.Fatal("sent_count 1 written")
	}
}

// The attribute form of Pub/Sub messages: plain values, names in any case,
// read after Didcomm- NATS headers and before the payload.
func TestAttributeRoundTrip(t *testing.T) {
	want := Headers{ID: "m 1", Thread: "thread/x", From: "did:ex:ü", SenderOrder: 7, SentCount: 3,
		ReceivedOrders: []ReceivedOrder{{ID: "did:ex:bob", Last: 4, Gaps: []uint64{2, 3}}}}
	attrs := map[string]string{"Didcomm-Sender-Order": "1", "other": "kept"}
	WriteAttributes(attrs, want)
	if attrs[AttrFrom] != "did:ex:ü" || attrs["other"] != "kept" || attrs[AttrReceivedOrders] != `[{"id":"did:ex:bob","last":4,"gaps":[2,3]}]` {
		t.Fatalf("written %v", attrs)
	}
	if _, ok := attrs["Didcomm-Sender-Order"]; ok {
		t.Fatalf("the same name in another case stayed: %v", attrs)
	}
	got, ok, err := ReadAttributes(attrs)
	if err != nil || !ok || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadAttributes = %+v, %v, %v\nwant %+v", got, ok, err, want)
	}
	got, err = Read(&adapter.Message{Attributes: map[string]string{"DIDComm-ID": "x", "didcomm-from": "a", "didcomm-sender-order": "2"}, Data: []byte(plainBid)})
	if err != nil || got.ID != "x" || got.SenderOrder != 2 {
		t.Fatalf("Read: attributes win over the payload: %+v, %v", got, err)
	}
	if _, err := Read(&adapter.Message{Attributes: map[string]string{AttrSenderOrder: "07"}}); !errors.Is(err, ErrInvalidSenderOrder) || !strings.Contains(err.Error(), AttrSenderOrder) {
		t.Fatalf("bad attribute: %v", err)
	}
	if _, ok, _ := ReadAttributes(map[string]string{"didcommish": "1"}); ok {
		t.Fatal("an attribute that is not one of the names was read")
	}
}

func TestReadRecognisesDIDComm(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    adapter.Message
		want error
	}{
		{"plain payload", adapter.Message{Data: []byte("hello")}, ErrNotDIDComm},
		{"JSON without type", adapter.Message{Data: []byte(`{"id":"x","sender_order":0}`)}, ErrNotDIDComm},
		{"JSON array", adapter.Message{Data: []byte(`[1]`)}, ErrNotDIDComm},
		{"plaintext", adapter.Message{Data: []byte(plainBid)}, nil},
		{"declared plaintext that is not JSON", adapter.Message{Data: []byte("x"), Header: nats.Header{"Content-Type": {PlaintextMediaType}}}, ErrInvalidHeader},
		{"declared plaintext without type", adapter.Message{Data: []byte(`{"id":"x","from":"a","sender_order":-1}`), Header: nats.Header{"Content-Type": {PlaintextMediaType}}}, ErrInvalidSenderOrder},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Read(&tc.m); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestBadHeadersAreTypedErrors(t *testing.T) {
	member := func(name, raw string) string {
		return `{"id":"m","type":"t","from":"did:ex:a",` + `"` + name + `":` + raw + `}`
	}
	for _, tc := range []struct {
		name, data string
		want       error
	}{
		{"sender_order 0", member("sender_order", "0"), ErrInvalidSenderOrder},
		{"sender_order negative", member("sender_order", "-3"), ErrInvalidSenderOrder},
		{"sender_order fractional", member("sender_order", "2.5"), ErrInvalidSenderOrder},
		{"sender_order integral fraction", member("sender_order", "2.0"), ErrInvalidSenderOrder},
		{"sender_order exponent", member("sender_order", "1e3"), ErrInvalidSenderOrder},
		{"sender_order string", member("sender_order", `"3"`), ErrInvalidSenderOrder},
		{"sender_order not JSON", member("sender_order", "07"), ErrInvalidHeader},
		{"sender_order too large", member("sender_order", "18446744073709551616"), ErrInvalidSenderOrder},
		{"sent_count 0", member("sent_count", "0"), ErrInvalidSentCount},
		{"sent_count negative", member("sent_count", "-1"), ErrInvalidSentCount},
		{"received_orders object", member("received_orders", `{"id":"a"}`), ErrInvalidReceivedOrders},
		{"received_orders no id", member("received_orders", `[{"last":2,"gaps":[]}]`), ErrInvalidReceivedOrders},
		{"received_orders numeric id", member("received_orders", `[{"id":5,"last":2,"gaps":[]}]`), ErrInvalidReceivedOrders},
		{"received_orders last 0", member("received_orders", `[{"id":"a","last":0,"gaps":[]}]`), ErrInvalidReceivedOrders},
		{"received_orders gap at last", member("received_orders", `[{"id":"a","last":4,"gaps":[4]}]`), ErrInvalidReceivedOrders},
		{"received_orders gap 0", member("received_orders", `[{"id":"a","last":4,"gaps":[0]}]`), ErrInvalidReceivedOrders},
		{"received_orders gap twice", member("received_orders", `[{"id":"a","last":4,"gaps":[2,2]}]`), ErrInvalidReceivedOrders},
		{"received_orders gaps not an array", member("received_orders", `[{"id":"a","last":4,"gaps":"2,3"}]`), ErrInvalidReceivedOrders},
		{"id not a string", `{"id":7,"type":"t","sender_order":1}`, ErrInvalidHeader},
		{"thid not a string", member("thid", "[]"), ErrInvalidHeader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ReadPlaintext([]byte(tc.data)); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("NATS header", func(t *testing.T) {
		for _, c := range [][2]string{{HeaderSenderOrder, "x"}, {HeaderSenderOrder, "07"}, {HeaderSenderOrder, " 7"}, {HeaderSentCount, "0"}, {HeaderReceivedOrders, "["}, {HeaderFrom, "%zz"}} {
			_, ok, err := ReadHeader(nats.Header{c[0]: {c[1]}})
			if !ok || err == nil {
				t.Errorf("%s: %q accepted", c[0], c[1])
			}
		}
	})
}

// null is absent, for every header; header names are case-insensitive.
func TestNullIsAbsentAndHeaderCase(t *testing.T) {
	h, err := ReadPlaintext([]byte(`{"id":"m","type":"t","thid":null,"from":"a","sender_order":null,"sent_count":null,"received_orders":null}`))
	if err != nil || h.Sequenced() || h.Thread != "" || h.ReceivedOrders != nil {
		t.Fatalf("%+v, %v", h, err)
	}
	h, ok, err := ReadHeader(nats.Header{"didcomm-sender-order": {"4"}, "DIDCOMM-FROM": {"did:ex:a"}, "Didcomm-Id": {"m"}})
	if err != nil || !ok || h.SenderOrder != 4 || h.From != "did:ex:a" {
		t.Fatalf("%+v, %v, %v", h, ok, err)
	}
}

func TestReceivedOrdersGapsAreSortedAndOmittedCounted(t *testing.T) {
	ros, err := ParseReceivedOrders([]byte(`[{"id":"a","last":9,"gaps":[5,2],"gaps_omitted":3,"extra":true}]`))
	if err != nil {
		t.Fatal(err)
	}
	if ros[0].Gaps[0] != 2 || ros[0].Gaps[1] != 5 || ros[0].GapsOmitted != 3 {
		t.Fatalf("%+v", ros)
	}
}

func FuzzReadPlaintext(f *testing.F) {
	f.Add([]byte(plainBid))
	f.Add([]byte(`{"id":"m","from":"a","sender_order":3,"sent_count":2,"received_orders":[{"id":"b","last":4,"gaps":[2,3]}]}`))
	f.Add([]byte(`{"sender_order":1e400}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ReadPlaintext(data)
		if err != nil {
			return
		}
		// What was read writes back and reads back the same.
		out, err := WritePlaintext(data, h)
		if err != nil {
			t.Fatalf("WritePlaintext of readable data: %v", err)
		}
		back, err := ReadPlaintext(out)
		if err != nil {
			t.Fatalf("written message unreadable: %v\n%s", err, out)
		}
		if h.SentCount == 1 {
			h.SentCount = 0 // written as no header
		}
		if !reflect.DeepEqual(renderHeaders(back), renderHeaders(h)) {
			t.Fatalf("round trip changed %+v into %+v", h, back)
		}
	})
}

func FuzzReadHeader(f *testing.F) {
	f.Add("m", "t", "did:ex:a", "3", "2", `[{"id":"b","last":4,"gaps":[2,3]}]`)
	f.Add("%", "", "", "0", "-1", `[{}]`)
	f.Fuzz(func(t *testing.T, id, thid, from, order, count, ros string) {
		h, _, err := ReadHeader(nats.Header{HeaderID: {id}, HeaderThread: {thid}, HeaderFrom: {from}, HeaderSenderOrder: {order}, HeaderSentCount: {count}, HeaderReceivedOrders: {ros}})
		if err != nil {
			return
		}
		nh := nats.Header{}
		WriteHeader(nh, h)
		back, _, err := ReadHeader(nh)
		if err != nil {
			t.Fatalf("written headers unreadable: %v", err)
		}
		if h.SentCount == 1 {
			h.SentCount = 0
		}
		if !reflect.DeepEqual(renderHeaders(back), renderHeaders(h)) {
			t.Fatalf("round trip changed %+v into %+v", h, back)
		}
	})
}

// renderHeaders is h with received_orders as they are written.
func renderHeaders(h Headers) Headers {
	if h.ReceivedOrders != nil {
		h.ReceivedOrders = renderable(h.ReceivedOrders)
	}
	return h
}
