// Package keyrouter maps Pub/Sub names and ordering keys onto JetStream
// names and subjects. It is pure: no I/O, no state.
//
// Layout, for project P, topic T, subscription S and ordering key K:
//
//	stream            JO_<P>__<T>                  (hash form past 255 bytes)
//	stream subjects   jetorder.<P>.<T>.>
//	keyed message     jetorder.<P>.<T>.k.<b0>.<b1>.<b2>.<b3>.<b4>.<b5>.<token(K)>
//	unkeyed message   jetorder.<P>.<T>.u
//	consumers         <P>__<S>_u (unkeyed), <P>__<S>_k_<hash(token)> (per key),
//	                  <P>__<S>_p_<NN> (partition NN, partitioned delivery),
//	                  <P>__<S>_all (a subscription without ordering)
//	delivery subject  _jetorder.deliver.<P>.<P>__<S> (push consumers deliver here)
//
// <P>, <T> and <S> are the ids with every byte outside [A-Za-z0-9-] written
// as _XX (upper-case hex), so they contain no '.', '*', '>' or '__' and the
// layout is injective. token(K) is described at KeyToken; b0..b5 are the
// bits of slot(K), 0..63, a hash of K (see Slot), lowest first, as "0" or
// "1": a partitioned subscription's partition filters on a prefix of them.
package keyrouter

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"math/bits"
	"strings"
	"unicode/utf8"
)

const (
	// MaxKeyBytes is the largest ordering key, in bytes (BR-010).
	MaxKeyBytes = 1024
	// MaxTokenBytes is the longest key token written in readable form; a
	// longer encoding is replaced by the hash form (see KeyToken).
	MaxTokenBytes = 256
	// SubjectRoot is the first token of every message subject.
	SubjectRoot = "jetorder"
	// DeliverRoot is the first token of every push delivery subject. It is
	// not under SubjectRoot so a delivery can never loop into a stream.
	DeliverRoot = "_jetorder.deliver"

	maxNameBytes  = 255 // JetStream's limit for stream and consumer names
	maxBaseBytes  = 200 // leaves room for the consumer suffixes
	hashTokenMark = "%%"
)

// ValidateOrderingKey reports whether key may be used as an ordering key:
// 1..1024 bytes of UTF-8. Any character is allowed, including '.', '*', '>',
// spaces and control characters: they are encoded, never interpreted.
func ValidateOrderingKey(key string) error {
	switch {
	case key == "":
		return ErrEmptyOrderingKey
	case len(key) > MaxKeyBytes:
		return ErrOrderingKeyTooLong
	case !utf8.ValidString(key):
		return ErrOrderingKeyNotUTF8
	}
	return nil
}

// ValidateProjectID accepts 1..100 characters of letters, digits and
// - _ . : ~ starting with a letter or digit. That covers Google project ids,
// legacy domain-scoped ones ("example.com:proj") and emulator names.
func ValidateProjectID(id string) error {
	if len(id) < 1 || len(id) > 100 || !isAlnum(id[0]) || !allIn(id, "-_.:~") {
		return fmt.Errorf("%w %q: must be 1-100 letters, digits or - _ . : ~, starting with a letter or digit", ErrInvalidProjectID, id)
	}
	return nil
}

// ValidateTopicID applies Google's rule for topic ids: 3..255 characters,
// starting with a letter, of letters, digits and - _ . ~ + %, not starting
// with "goog".
func ValidateTopicID(id string) error {
	if err := validateResourceID(id); err != nil {
		return fmt.Errorf("%w %q: %s", ErrInvalidTopicID, id, err)
	}
	return nil
}

// ValidateSubscriptionID applies the same rule as ValidateTopicID.
func ValidateSubscriptionID(id string) error {
	if err := validateResourceID(id); err != nil {
		return fmt.Errorf("%w %q: %s", ErrInvalidSubscriptionID, id, err)
	}
	return nil
}

type reason string

func (r reason) Error() string { return string(r) }

func validateResourceID(id string) error {
	switch {
	case len(id) < 3 || len(id) > 255:
		return reason("must be 3-255 characters")
	case !isLetter(id[0]):
		return reason("must start with a letter")
	case strings.HasPrefix(strings.ToLower(id), "goog"):
		return reason(`must not start with "goog"`)
	case !allIn(id, "-_.~+%"):
		return reason("may contain only letters, digits and - _ . ~ + %")
	}
	return nil
}

// StreamName is the JetStream stream that holds topic's messages.
func StreamName(project, topic string) string {
	name := "JO_" + encodeName(project) + "__" + encodeName(topic)
	if len(name) > maxNameBytes {
		return "JO_" + hashString(project+"\x00"+topic)
	}
	return name
}

// MaxKeyStreams bounds how many key streams a topic's keyed messages may be
// split over.
const MaxKeyStreams = 16

// ValidKeyStreams reports whether n is a key stream count a topic may
// have: a power of two up to MaxKeyStreams (1: no key streams).
func ValidKeyStreams(n int) bool { return n >= 1 && n <= MaxKeyStreams && n&(n-1) == 0 }

// KeyStreamSeqBits: a topic's streams number their messages in ranges of
// their own, 2^KeyStreamSeqBits each, so that a sequence names one message
// of the topic across its streams, and the stream it is in. The topic's
// own stream has the first range (from 1), key stream i the range i+1. The
// largest sequence stays below 2^53, exact in JSON numbers everywhere.
const KeyStreamSeqBits = 48

// KeyStreamName is key stream i of a topic whose keyed messages are split
// over several streams: it holds the keyed subjects of PartitionFilter(n,
// i). ("__k" never occurs in StreamName's encoded ids.)
func KeyStreamName(project, topic string, i int) string {
	suffix := fmt.Sprintf("__k%02d", i)
	name := StreamName(project, topic) + suffix
	if len(name) > maxNameBytes {
		return "JO_" + hashString(project+"\x00"+topic) + suffix
	}
	return name
}

// KeyStreamFirstSeq is the first sequence of key stream i.
func KeyStreamFirstSeq(i int) uint64 { return uint64(i+1) << KeyStreamSeqBits }

// TopicSubjects is the subject filter a topic's stream captures.
func TopicSubjects(project, topic string) string {
	return topicPrefix(project, topic) + ">"
}

// ProjectSubjects matches every topic stream of a project; listing streams by
// this subject lists the project's topics.
func ProjectSubjects(project string) string {
	return SubjectRoot + "." + encodeName(project) + ".>"
}

// KeyedSubject is the subject of a message with ordering key key. key must
// have passed ValidateOrderingKey.
func KeyedSubject(project, topic, key string) string {
	return topicPrefix(project, topic) + "k." + slotTokens(Slot(key), SlotBits) + KeyToken(key)
}

// SlotBits is how many bits of the slot keyed subjects carry, one token
// each; Slots = 2^SlotBits.
const SlotBits = 6

// Slots is how many slots keyed subjects are spread over. A partitioned
// subscription's partition count divides it.
const Slots = 1 << SlotBits

// Slot is the slot of an ordering key: FNV-1a of the key, modulo Slots. It
// is part of the wire layout, so it never changes.
func Slot(key string) int {
	h := uint32(2166136261)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % Slots)
}

// slotTokens writes the low bits of slot, lowest first, as "0." or "1."
// tokens: the slots of one partition (slot mod 2^bits) then share a prefix,
// so one filter covers them. (Several filter subjects per consumer make
// nats-server search much harder for the next message.)
func slotTokens(slot, bits int) string {
	b := make([]byte, 0, 2*bits)
	for i := range bits {
		b = append(b, '0'+byte(slot>>i&1), '.')
	}
	return string(b)
}

// PartitionFilter is the subject filter of partition i of n, n a power of
// two up to Slots: the keyed subjects whose slot mod n is i.
func PartitionFilter(project, topic string, n, i int) string {
	return topicPrefix(project, topic) + "k." + slotTokens(i, bits.TrailingZeros(uint(n))) + ">"
}

// PartitionConsumer is the consumer of partition i of a partitioned
// subscription.
func PartitionConsumer(project, sub string, i int) string {
	return PartitionConsumerPrefix(project, sub) + fmt.Sprintf("%02d", i)
}

// PartitionConsumerPrefix is the prefix every partition consumer of a
// subscription shares.
func PartitionConsumerPrefix(project, sub string) string {
	return SubscriptionBase(project, sub) + "_p_"
}

// KeyedFilter matches every keyed message of a topic.
func KeyedFilter(project, topic string) string {
	return topicPrefix(project, topic) + "k.>"
}

// UnkeyedSubject is the subject of a message without an ordering key.
func UnkeyedSubject(project, topic string) string {
	return topicPrefix(project, topic) + "u"
}

// TokenOfSubject returns the key token of a keyed message subject.
func TokenOfSubject(subject string) (string, bool) {
	i := strings.LastIndexByte(subject, '.')
	// ".k" and SlotBits one-digit tokens precede the token.
	start := i - 2*SlotBits - 2
	if start < 0 || subject[start:start+2] != ".k" {
		return "", false
	}
	for j := start + 2; j < i; j += 2 {
		if subject[j] != '.' || subject[j+1] != '0' && subject[j+1] != '1' {
			return "", false
		}
	}
	return subject[i+1:], true
}

func topicPrefix(project, topic string) string {
	return SubjectRoot + "." + encodeName(project) + "." + encodeName(topic) + "."
}

// SubscriptionBase is the common prefix of a subscription's consumer names.
func SubscriptionBase(project, sub string) string {
	base := encodeName(project) + "__" + encodeName(sub)
	if len(base) > maxBaseBytes {
		return "_h" + hashString(project+"\x00"+sub)
	}
	return base
}

// UnkeyedConsumer is the consumer that delivers a subscription's unkeyed
// messages when ordering is enabled.
func UnkeyedConsumer(project, sub string) string { return SubscriptionBase(project, sub) + "_u" }

// AllConsumer is the single consumer of a subscription without ordering.
func AllConsumer(project, sub string) string { return SubscriptionBase(project, sub) + "_all" }

// KeyConsumerPrefix is the prefix every per-key consumer of a subscription
// shares.
func KeyConsumerPrefix(project, sub string) string { return SubscriptionBase(project, sub) + "_k_" }

// KeyConsumer is the consumer for one key token of a subscription. The name
// is a hash so it has a fixed length and never depends on the file system's
// case sensitivity; the same (subscription, key) always gives the same name,
// so every process agrees on it.
func KeyConsumer(project, sub, token string) string {
	return KeyConsumerPrefix(project, sub) + hashString(token)[:26]
}

// DeliverSubject is where a subscription's push consumers deliver.
func DeliverSubject(project, sub string) string {
	return DeliverRoot + "." + encodeName(project) + "." + SubscriptionBase(project, sub)
}

// KVKey turns ids into a KV key ("<P>.<S>").
func KVKey(project, id string) string { return encodeName(project) + "." + encodeName(id) }

// KVToken turns any string into one KV key token: [A-Za-z0-9-] as they
// are, every other byte as _XX, and strings whose token would be longer
// than MaxTokenBytes as "=" followed by the base32 of their SHA-256 (the
// readable form never holds '=').
func KVToken(s string) string {
	enc := encodeName(s)
	if len(enc) <= MaxTokenBytes {
		return enc
	}
	return "=" + hashString(s)
}

// KVProjectFilter matches every KVKey of a project.
func KVProjectFilter(project string) string { return encodeName(project) + ".*" }

// encodeName keeps [A-Za-z0-9-] and writes every other byte as _XX.
func encodeName(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isAlnum(c) || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('_')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&15])
	}
	return b.String()
}

func hashString(s string) string {
	sum := sha256.Sum256([]byte(s))
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:]))
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isAlnum(c byte) bool  { return isLetter(c) || c >= '0' && c <= '9' }

func allIn(s, extra string) bool {
	for i := 0; i < len(s); i++ {
		if !isAlnum(s[i]) && strings.IndexByte(extra, s[i]) < 0 {
			return false
		}
	}
	return true
}
