// Package rsb holds the RSB event model's pure functions that more than
// one package of this repository needs.
package rsb

import "github.com/google/uuid"

// MessageID is the RSB event id of the message with sequence number seq
// from the publisher sender: UUID v5 with sender as namespace and the
// 8-digit lower-case hex of seq as name. The id doubles as Nats-Msg-Id, so a
// retried publish is stored once.
func MessageID(sender uuid.UUID, seq uint32) string {
	const digits = "0123456789abcdef"
	var name [8]byte
	for i := 7; i >= 0; i-- {
		name[i] = digits[seq&0xf]
		seq >>= 4
	}
	return uuid.NewSHA1(sender, name[:]).String()
}
