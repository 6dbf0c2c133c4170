package integration

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/jetorder/jetorder/adapter"
	"github.com/jetorder/jetorder/internal/rsb"
)

// A publisher started near 2^32 wraps its sequence numbers to 0, every id is
// the RSB UUID v5 of (sender, sequence), and the RSB metadata reaches the
// handler with the receiving side's times added.
func TestRSBIdentityAndMetadata(t *testing.T) {
	e := newEnv(t)
	topic := e.createTopic("rsb-events")
	sub := e.createSub("sub-1", adapter.SubscriptionConfig{Topic: topic, EnableMessageOrdering: true})
	sender := uuid.MustParse("D8FBFEF4-4EB0-4C89-9716-C425DED3C527")
	topic.PublishSettings = adapter.PublishSettings{SenderID: sender, FirstSequence: 4294967294}

	ctx := context.Background()
	created := time.Now().Add(-time.Minute)
	cause := uuid.New()
	wantSeqs := []uint32{4294967294, 4294967295, 0}
	var ids []string
	for i := range wantSeqs {
		msg := &adapter.Message{Data: []byte{byte(i)}, OrderingKey: "k"}
		if i == 0 {
			msg.CreateTime = created
			msg.UserTimes = map[string]time.Time{"measured": created}
			msg.UserInfos = map[string]string{"unit": "°C"}
			msg.Causes = []uuid.UUID{cause}
		}
		id, err := topic.Publish(ctx, msg).Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := rsb.MessageID(sender, wantSeqs[i]); id != want {
			t.Fatalf("message %d: id %s, want %s", i, id, want)
		}
		ids = append(ids, id)
	}

	got := make(chan *adapter.Message, 3)
	startReceive(t, sub, func(_ context.Context, m *adapter.Message) { got <- m; m.Ack() })
	for i, seq := range wantSeqs {
		var m *adapter.Message
		select {
		case m = <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("message %d not delivered", i)
		}
		if m.ID != ids[i] || m.SenderID != sender || m.SequenceNumber != seq {
			t.Fatalf("message %d: id %s sender %s seq %d", i, m.ID, m.SenderID, m.SequenceNumber)
		}
		if m.SendTime.IsZero() || m.CreateTime.After(m.SendTime) || m.SendTime.After(m.ReceiveTime) || m.ReceiveTime.After(m.DeliverTime) {
			t.Fatalf("message %d times out of order: create %v send %v receive %v deliver %v", i, m.CreateTime, m.SendTime, m.ReceiveTime, m.DeliverTime)
		}
		if m.SendTime.Nanosecond()%1000 != 0 || m.SendTime.Location() != time.UTC {
			t.Fatalf("send time %v is not UTC with microsecond precision", m.SendTime)
		}
		if i == 0 {
			if !m.CreateTime.Equal(created.Truncate(time.Microsecond)) || !m.UserTimes["measured"].Equal(created.Truncate(time.Microsecond)) ||
				m.UserInfos["unit"] != "°C" || len(m.Causes) != 1 || m.Causes[0] != cause {
				t.Fatalf("metadata: create %v user times %v infos %v causes %v", m.CreateTime, m.UserTimes, m.UserInfos, m.Causes)
			}
		}
	}
}
