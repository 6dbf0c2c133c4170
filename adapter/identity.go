package adapter

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/jetorder/jetorder/internal/rsb"
	"github.com/jetorder/jetorder/keyrouter"
)

// sequencer hands out a publisher's 32-bit sequence numbers: 0, 1, ...,
// 4294967295, then 0 again. The publisher serialises take, so sequence
// numbers follow its queue order.
type sequencer struct {
	sender uuid.UUID
	next   uint32
	// senderID is the sender header's value, shared by every message:
	// nothing changes a queued message's headers.
	senderID []string
}

func (s *sequencer) take() (uuid.UUID, uint32) {
	seq := s.next
	s.next++ // uint32 arithmetic wraps to 0 after 4294967295
	return s.sender, seq
}

// stamp takes the next sequence number and stamps a message's headers h
// with it and the sender id; it returns the message id, which is also its
// Nats-Msg-Id.
func (s *sequencer) stamp(h nats.Header) string {
	if s.senderID == nil {
		s.senderID = []string{s.sender.String()}
	}
	sender, seq := s.take()
	id := rsb.MessageID(sender, seq)
	h[headerSenderID] = s.senderID
	h[headerSequence] = []string{strconv.FormatUint(uint64(seq), 10)}
	h[headerNatsMsgID] = []string{id}
	return id
}

// RSB metadata headers (docs/WIRE.md).
const (
	headerSenderID     = "Jetorder-Sender-Id"
	headerSequence     = "Jetorder-Sequence"
	headerCreateTime   = "Jetorder-Create-Time"
	headerSendTime     = "Jetorder-Send-Time"
	headerCause        = "Jetorder-Cause"
	headerUserTimePfx  = "Jetorder-User-Time-"
	headerUserInfoPfx  = "Jetorder-User-Info-"
	rsbTimeLayout      = "2006-01-02T15:04:05.000000Z07:00"
	maxCauses          = 100
	maxUserMetaEntries = 100
)

// formatTime writes t in UTC with microsecond precision, as RSB stores times
// (rsbTimeLayout). It is written out by hand because every message carries
// two times and time.Format showed in publish profiles.
func formatTime(t time.Time) string {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.Truncate(time.Microsecond).Format(rsbTimeLayout)
	}
	hour, minute, sec := t.Clock()
	b := make([]byte, 0, len("2006-01-02T15:04:05.000000Z"))
	b = appendDigits(b, year, 4)
	b = appendDigits(append(b, '-'), int(month), 2)
	b = appendDigits(append(b, '-'), day, 2)
	b = appendDigits(append(b, 'T'), hour, 2)
	b = appendDigits(append(b, ':'), minute, 2)
	b = appendDigits(append(b, ':'), sec, 2)
	b = appendDigits(append(b, '.'), t.Nanosecond()/1000, 6)
	return string(append(b, 'Z'))
}

// appendDigits appends v as exactly width decimal digits (v < 10^width).
func appendDigits(b []byte, v, width int) []byte {
	for i := width - 1; i >= 0; i-- {
		b = append(b, 0)
	}
	for i := len(b) - 1; i >= len(b)-width; i-- {
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return b
}

func parseTime(s string) (time.Time, bool) {
	t, err := time.Parse(time.RFC3339Nano, s)
	return t.UTC(), err == nil
}

// validateMetadata checks what the application set of the RSB metadata.
func validateMetadata(msg *Message) error {
	if len(msg.Causes) > maxCauses {
		return fmt.Errorf("%w: %d causes, at most %d", ErrInvalidMessage, len(msg.Causes), maxCauses)
	}
	if len(msg.UserTimes) > maxUserMetaEntries || len(msg.UserInfos) > maxUserMetaEntries {
		return fmt.Errorf("%w: more than %d user times or user infos", ErrInvalidMessage, maxUserMetaEntries)
	}
	for k := range msg.UserTimes {
		if k == "" || len(k) > maxAttrKeyBytes {
			return fmt.Errorf("%w: user time key %.32q must be 1-%d bytes", ErrInvalidMessage, k, maxAttrKeyBytes)
		}
	}
	for k, v := range msg.UserInfos {
		if k == "" || len(k) > maxAttrKeyBytes || len(v) > maxAttrValueBytes {
			return fmt.Errorf("%w: user info %.32q: key must be 1-%d bytes, value at most %d", ErrInvalidMessage, k, maxAttrKeyBytes, maxAttrValueBytes)
		}
	}
	return nil
}

// sendTime is the value of the send time header: a time formatted by
// formatTime, once for a whole run of batches, and shared by its messages.
func sendTime(t time.Time) []string { return []string{formatTime(t)} }

// writeSendTime stamps the time a message goes on the wire.
func writeSendTime(h nats.Header, sent []string) { h[headerSendTime] = sent }

// writeMetadata puts the application's RSB metadata into h.
func writeMetadata(h nats.Header, msg *Message, created time.Time) {
	h[headerCreateTime] = []string{formatTime(created)}
	if len(msg.Causes) > 0 {
		ids := make([]string, len(msg.Causes))
		for i, c := range msg.Causes {
			ids[i] = c.String()
		}
		h[headerCause] = []string{strings.Join(ids, ",")}
	}
	for k, t := range msg.UserTimes {
		h[headerUserTimePfx+encodeHeaderName(k)] = []string{formatTime(t)}
	}
	for k, v := range msg.UserInfos {
		h[headerUserInfoPfx+encodeHeaderName(k)] = []string{keyrouter.EncodeKey(v)}
	}
}

// readMetadata fills m's RSB fields from h. Values it cannot parse are left
// at their zero values: a header another writer garbled is not an error of
// the delivery.
func readMetadata(h nats.Header, m *Message) {
	if id, err := uuid.Parse(h.Get(headerSenderID)); err == nil {
		m.SenderID = id
	}
	if seq, err := strconv.ParseUint(h.Get(headerSequence), 10, 32); err == nil {
		m.SequenceNumber = uint32(seq)
	}
	if t, ok := parseTime(h.Get(headerCreateTime)); ok {
		m.CreateTime = t
	}
	if t, ok := parseTime(h.Get(headerSendTime)); ok {
		m.SendTime = t
	}
	if v := h.Get(headerCause); v != "" {
		for _, s := range strings.Split(v, ",") {
			if id, err := uuid.Parse(strings.TrimSpace(s)); err == nil {
				m.Causes = append(m.Causes, id)
			}
		}
	}
	for name, vals := range h {
		if len(vals) == 0 {
			continue
		}
		switch {
		case strings.HasPrefix(name, headerUserTimePfx):
			k, err := keyrouter.DecodeKey(name[len(headerUserTimePfx):])
			t, ok := parseTime(vals[0])
			if err == nil && ok {
				if m.UserTimes == nil {
					m.UserTimes = make(map[string]time.Time)
				}
				m.UserTimes[k] = t
			}
		case strings.HasPrefix(name, headerUserInfoPfx):
			k, err1 := keyrouter.DecodeKey(name[len(headerUserInfoPfx):])
			v, err2 := keyrouter.DecodeKey(vals[0])
			if err1 == nil && err2 == nil {
				if m.UserInfos == nil {
					m.UserInfos = make(map[string]string)
				}
				m.UserInfos[k] = v
			}
		}
	}
}
