package adapter

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/internal/rsb"
)

// The two test vectors of the RSB event model (seeds/004).
func TestMessageIDTestVectors(t *testing.T) {
	tests := []struct {
		sender string
		seq    uint32
		want   string
	}{
		{"D8FBFEF4-4EB0-4C89-9716-C425DED3C527", 0, "84F43861-433F-5253-AFBB-A613A5E04D71"},
		{"BF948D47-618F-4B04-AAC5-0AB5A1A79267", 378, "BD27BE7D-87DE-5336-BECA-44FC60DE46A0"},
	}
	for _, tt := range tests {
		got := rsb.MessageID(uuid.MustParse(tt.sender), tt.seq)
		if got != uuid.MustParse(tt.want).String() {
			t.Errorf("MessageID(%s, %d) = %s, want %s", tt.sender, tt.seq, got, tt.want)
		}
	}
}

func TestSequencerWrapsAt32Bits(t *testing.T) {
	s := &sequencer{sender: uuid.New(), next: 4294967294}
	var got []uint32
	for range 4 {
		_, seq := s.take()
		got = append(got, seq)
	}
	want := []uint32{4294967294, 4294967295, 0, 1}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("sequence numbers %v, want %v", got, want)
		}
	}
}

func TestMetadataRoundTrip(t *testing.T) {
	sender := uuid.New()
	created := time.Date(2026, 11, 21, 10, 0, 0, 123456789, time.FixedZone("X", 3600))
	sent := created.Add(time.Millisecond)
	cause := uuid.New()
	in := &Message{
		UserTimes: map[string]time.Time{"sensor read": created},
		UserInfos: map[string]string{"origin:host": "a b\r\nc"},
		Causes:    []uuid.UUID{cause},
	}
	h := nats.Header{}
	writeMetadata(h, in, created)
	id := (&sequencer{sender: sender, next: 4294967295}).stamp(h)
	writeSendTime(h, sendTime(sent))
	if id != rsb.MessageID(sender, 4294967295) || h.Get("Nats-Msg-Id") != id {
		t.Fatalf("identity: id %s, Nats-Msg-Id %s", id, h.Get("Nats-Msg-Id"))
	}
	if got := h.Get(headerCreateTime); got != "2026-11-21T09:00:00.123456Z" {
		t.Fatalf("create time written as %q, want UTC with microseconds", got)
	}
	var out Message
	readMetadata(h, &out)
	if out.SenderID != sender || out.SequenceNumber != 4294967295 {
		t.Fatalf("sender %v seq %d", out.SenderID, out.SequenceNumber)
	}
	if !out.CreateTime.Equal(created.Truncate(time.Microsecond)) || !out.SendTime.Equal(sent.Truncate(time.Microsecond)) {
		t.Fatalf("times %v %v", out.CreateTime, out.SendTime)
	}
	if !out.UserTimes["sensor read"].Equal(created.Truncate(time.Microsecond)) || out.UserInfos["origin:host"] != "a b\r\nc" {
		t.Fatalf("user metadata %v %v", out.UserTimes, out.UserInfos)
	}
	if len(out.Causes) != 1 || out.Causes[0] != cause {
		t.Fatalf("causes %v", out.Causes)
	}
	// Garbled headers leave fields at zero instead of failing.
	var bad Message
	readMetadata(nats.Header{headerSenderID: {"nope"}, headerSequence: {"4294967296"}, headerCreateTime: {"yesterday"}, headerCause: {"x,y"}}, &bad)
	if bad.SenderID != uuid.Nil || bad.SequenceNumber != 0 || !bad.CreateTime.IsZero() || bad.Causes != nil {
		t.Fatalf("garbled headers produced %+v", bad)
	}
}

func TestFormatTimeMatchesLayout(t *testing.T) {
	for _, tm := range []time.Time{
		time.Date(2026, 1, 2, 3, 4, 5, 6_789, time.UTC),
		time.Date(1999, 12, 31, 23, 59, 59, 999_999_999, time.FixedZone("X", -5*3600)),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC),
	} {
		want := tm.UTC().Truncate(time.Microsecond).Format(rsbTimeLayout)
		if got := formatTime(tm); got != want {
			t.Errorf("formatTime(%v) = %s, want %s", tm, got, want)
		}
	}
}
