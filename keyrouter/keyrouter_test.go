package keyrouter

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestValidateOrderingKey(t *testing.T) {
	tests := []struct {
		name string
		key  string
		want error
	}{
		{"simple", "user-123", nil},
		{"one byte", "x", nil},
		{"max length", strings.Repeat("x", 1024), nil},
		{"unicode at max", strings.Repeat("é", 512), nil},
		{"wildcards are just characters", "a.*.>", nil},
		{"spaces and controls", " \t\r\n\x00", nil},
		{"empty", "", ErrEmptyOrderingKey},
		{"too long", strings.Repeat("x", 1025), ErrOrderingKeyTooLong},
		{"unicode too long", strings.Repeat("é", 513), ErrOrderingKeyTooLong},
		{"not utf8", "a\xffb", ErrOrderingKeyNotUTF8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateOrderingKey(tt.key)
			if !errors.Is(err, tt.want) {
				t.Fatalf("ValidateOrderingKey = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestOrderingKeyErrorTexts(t *testing.T) {
	// The specification's exact wording; clients display it.
	if got := ValidateOrderingKey("").Error(); got != "Ordering key cannot be empty" {
		t.Errorf("empty key text = %q", got)
	}
	if got := ValidateOrderingKey(strings.Repeat("k", 1025)).Error(); got != "Ordering key exceeds maximum length of 1024 bytes" {
		t.Errorf("long key text = %q", got)
	}
}

func TestValidateIDs(t *testing.T) {
	tests := []struct {
		name     string
		validate func(string) error
		id       string
		want     error
	}{
		{"topic ok", ValidateTopicID, "ordered-events", nil},
		{"topic all chars", ValidateTopicID, "a-_.~+%9", nil},
		{"topic 255", ValidateTopicID, "t" + strings.Repeat("x", 254), nil},
		{"topic short", ValidateTopicID, "ab", ErrInvalidTopicID},
		{"topic long", ValidateTopicID, "t" + strings.Repeat("x", 255), ErrInvalidTopicID},
		{"topic digit first", ValidateTopicID, "1abc", ErrInvalidTopicID},
		{"topic goog", ValidateTopicID, "google-topic", ErrInvalidTopicID},
		{"topic wildcard", ValidateTopicID, "abc*", ErrInvalidTopicID},
		{"topic gt", ValidateTopicID, "abc>", ErrInvalidTopicID},
		{"topic space", ValidateTopicID, "ab c", ErrInvalidTopicID},
		{"topic slash", ValidateTopicID, "ab/c", ErrInvalidTopicID},
		{"sub ok", ValidateSubscriptionID, "sub-1", nil},
		{"sub empty", ValidateSubscriptionID, "", ErrInvalidSubscriptionID},
		{"sub unicode", ValidateSubscriptionID, "subé", ErrInvalidSubscriptionID},
		{"project ok", ValidateProjectID, "my-project", nil},
		{"project short", ValidateProjectID, "p", nil},
		{"project domain", ValidateProjectID, "example.com:proj", nil},
		{"project empty", ValidateProjectID, "", ErrInvalidProjectID},
		{"project wildcard", ValidateProjectID, "p*", ErrInvalidProjectID},
		{"project leading dash", ValidateProjectID, "-p", ErrInvalidProjectID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.validate(tt.id)
			if !errors.Is(err, tt.want) {
				t.Fatalf("got %v, want %v", err, tt.want)
			}
		})
	}
}

func TestKeyToken(t *testing.T) {
	tests := []struct{ key, token string }{
		{"user-123", "user-123"},
		{"users:42", "users:42"},
		{"tenant/a@b", "tenant/a@b"},
		{"a.b", "a%2Eb"},
		{"*", "%2A"},
		{">", "%3E"},
		{"a b", "a%20b"},
		{"100%", "100%25"},
		{"é", "%C3%A9"},
		{"\x00", "%00"},
	}
	for _, tt := range tests {
		t.Run(tt.token, func(t *testing.T) {
			if got := KeyToken(tt.key); got != tt.token {
				t.Fatalf("KeyToken(%q) = %q, want %q", tt.key, got, tt.token)
			}
			back, err := DecodeKey(tt.token)
			if err != nil || back != tt.key {
				t.Fatalf("DecodeKey(%q) = %q, %v", tt.token, back, err)
			}
		})
	}
}

func TestKeyTokenHashForm(t *testing.T) {
	long := strings.Repeat("k", MaxTokenBytes+1)
	tok := KeyToken(long)
	if !IsHashToken(tok) || len(tok) != 2+52 {
		t.Fatalf("long key token = %q, want hash form", tok)
	}
	if KeyToken(long+"x") == tok {
		t.Fatal("two long keys share a token")
	}
	atLimit := strings.Repeat("k", MaxTokenBytes)
	if KeyToken(atLimit) != atLimit {
		t.Fatal("a key of MaxTokenBytes safe bytes must stay readable")
	}
	// 86 dots encode to 258 bytes: hashed although the key is short.
	if !IsHashToken(KeyToken(strings.Repeat(".", 86))) {
		t.Fatal("an encoding over MaxTokenBytes must be hashed")
	}
}

func TestDecodeKeyRejectsBadEncoding(t *testing.T) {
	for _, s := range []string{"%", "%4", "%zz", "a%g0"} {
		if _, err := DecodeKey(s); !errors.Is(err, ErrInvalidEncoding) {
			t.Errorf("DecodeKey(%q) err = %v, want ErrInvalidEncoding", s, err)
		}
	}
}

func TestSubjectsAndNames(t *testing.T) {
	if got := KeyedSubject("p", "orders", "a.*"); got != "jetorder.p.orders.k."+slotTokens(Slot("a.*"), SlotBits)+"a%2E%2A" {
		t.Fatalf("KeyedSubject = %q", got)
	}
	if got := UnkeyedSubject("p", "or.ders"); got != "jetorder.p.or_2Eders.u" {
		t.Fatalf("UnkeyedSubject = %q", got)
	}
	if got := StreamName("my-proj", "orders"); got != "JO_my-proj__orders" {
		t.Fatalf("StreamName = %q", got)
	}
	tok, ok := TokenOfSubject(KeyedSubject("p", "t.k", "x.y"))
	if !ok || tok != KeyToken("x.y") {
		t.Fatalf("TokenOfSubject = %q, %v", tok, ok)
	}
	if _, ok := TokenOfSubject(UnkeyedSubject("p", "t")); ok {
		t.Fatal("TokenOfSubject accepted an unkeyed subject")
	}
	// Names that would collide under a naive join stay apart.
	if StreamName("a_b", "c") == StreamName("a", "b_c") {
		t.Fatal("stream names collide")
	}
	if SubscriptionBase("a_b", "c") == SubscriptionBase("a", "b_c") {
		t.Fatal("subscription bases collide")
	}
	long := "t" + strings.Repeat(".", 254)
	for _, name := range []string{StreamName("p", long), KeyConsumer("p", long, "k"), UnkeyedConsumer("p", long), AllConsumer("p", long)} {
		if len(name) > maxNameBytes || strings.ContainsAny(name, " \t\r\n.*>/\\") {
			t.Fatalf("invalid JetStream name %q", name)
		}
	}
	if KeyConsumer("p", "s", "a") == KeyConsumer("p", "s", "A") {
		t.Fatal("key consumers collide")
	}
	if !strings.HasPrefix(KeyConsumer("p", "s", "a"), KeyConsumerPrefix("p", "s")) {
		t.Fatal("key consumer lacks its prefix")
	}
}

// subjectSafe is the property every token must have: a single subject token
// that no NATS wildcard rule can interpret.
func subjectSafe(tok string) bool {
	if tok == "" || !utf8.ValidString(tok) {
		return false
	}
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c <= ' ' || c >= 0x7f || c == '.' || c == '*' || c == '>' {
			return false
		}
	}
	return true
}

func FuzzKeyToken(f *testing.F) {
	for _, s := range []string{"user-123", "a.b", "*", ">", "a.*.>", " ", "%", "%41", "A", "é", "\x00\n", strings.Repeat("x", 300), strings.Repeat("%", 90)} {
		f.Add(s, s+"x")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if ValidateOrderingKey(a) != nil || ValidateOrderingKey(b) != nil {
			return
		}
		ta, tb := KeyToken(a), KeyToken(b)
		for _, tok := range []string{ta, tb} {
			if !subjectSafe(tok) {
				t.Fatalf("token %q is not subject-safe", tok)
			}
			if len(tok) > MaxTokenBytes {
				t.Fatalf("token %q longer than MaxTokenBytes", tok)
			}
		}
		if a != b && ta == tb && !(IsHashToken(ta) && IsHashToken(tb)) {
			t.Fatalf("keys %q and %q share token %q outside the hash form", a, b, ta)
		}
		if !IsHashToken(ta) {
			back, err := DecodeKey(ta)
			if err != nil || back != a {
				t.Fatalf("DecodeKey(KeyToken(%q)) = %q, %v", a, back, err)
			}
		}
		enc := EncodeKey(a)
		if !subjectSafe(enc) {
			t.Fatalf("EncodeKey(%q) = %q is not header/subject safe", a, enc)
		}
		if back, err := DecodeKey(enc); err != nil || back != a {
			t.Fatalf("DecodeKey(EncodeKey(%q)) = %q, %v", a, back, err)
		}
		subj := KeyedSubject("p", "topic", a)
		if tok, ok := TokenOfSubject(subj); !ok || tok != ta {
			t.Fatalf("subject %q does not end in its token", subj)
		}
		if strings.Count(subj, ".") != 10 {
			t.Fatalf("subject %q has a token count other than 11", subj)
		}
	})
}

func TestKVToken(t *testing.T) {
	kvSafe := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if !isAlnum(s[i]) && !strings.ContainsRune("-_=", rune(s[i])) {
				return false
			}
		}
		return s != ""
	}
	for _, s := range []string{"thread-1", "did:ex:alice", "a.b*c>", "ü\x00\n", strings.Repeat("x", MaxTokenBytes+1)} {
		tok := KVToken(s)
		if !kvSafe(tok) || len(tok) > MaxTokenBytes+1 {
			t.Errorf("KVToken(%.20q) = %q: not one short KV key token", s, tok)
		}
	}
	if KVToken("a.b") == KVToken("a_2Eb") {
		t.Error("KVToken collides for a.b and a_2Eb")
	}
	if KVToken("thread-1") != "thread-1" {
		t.Errorf("KVToken(thread-1) = %q, want it readable", KVToken("thread-1"))
	}
}

func TestSlotsAndPartitions(t *testing.T) {
	// The slot is part of the wire layout: these values must never change.
	for key, want := range map[string]int{"a": 0xe40c292c % Slots, "device-1": Slot("device-1")} {
		if got := Slot(key); got != want {
			t.Errorf("Slot(%q) = %d, want %d", key, got, want)
		}
	}
	counts := make([]int, Slots)
	for i := range 64 * 100 {
		counts[Slot("key-"+strconv.Itoa(i))]++
	}
	for s, n := range counts {
		if n < 50 || n > 160 {
			t.Errorf("slot %d got %d of 6400 keys; the hash spreads badly", s, n)
		}
	}
	// Every slot belongs to exactly one partition, for every valid count.
	for _, n := range []int{1, 2, 4, 8, 16, 32, 64} {
		for slot := range Slots {
			subj := KeyedSubject("p", "t", "x") // shape only
			subj = strings.Replace(subj, "k."+slotTokens(Slot("x"), SlotBits), "k."+slotTokens(slot, SlotBits), 1)
			matches := 0
			for i := range n {
				if subjectMatches(PartitionFilter("p", "t", n, i), subj) {
					matches++
					if slot%n != i {
						t.Errorf("%d partitions: slot %d in partition %d", n, slot, i)
					}
				}
			}
			if matches != 1 {
				t.Errorf("%d partitions: slot %d in %d partitions", n, slot, matches)
			}
		}
	}
	if got, want := PartitionFilter("p", "t", 8, 5), "jetorder.p.t.k.1.0.1.>"; got != want {
		t.Errorf("PartitionFilter(8, 5) = %q, want %q", got, want)
	}
}

// subjectMatches is NATS subject matching for literal subjects.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

func TestKeyStreamNames(t *testing.T) {
	if got := KeyStreamName("my-proj", "orders", 3); got != "JO_my-proj__orders__k03" {
		t.Fatalf("KeyStreamName = %q", got)
	}
	// No topic's own stream can have a key stream's name: "__k" never
	// occurs in an encoded id ("_" is written "_5F").
	if KeyStreamName("p", "t", 0) == StreamName("p", "t__k00") {
		t.Fatal("a key stream name is a topic's stream name")
	}
	long := strings.Repeat("t", 250)
	if got := KeyStreamName("p", long, 15); len(got) > maxNameBytes || !strings.HasSuffix(got, "__k15") || got == KeyStreamName("p", long+"x", 15) {
		t.Fatalf("long topic: %q", got)
	}
	// The ranges of sequences: the topic's stream from 1, key stream i
	// from (i+1)<<48, all below 2^53.
	if KeyStreamFirstSeq(0) != 1<<48 || KeyStreamFirstSeq(MaxKeyStreams-1)+1<<KeyStreamSeqBits > 1<<53 {
		t.Fatalf("first sequences %d .. %d", KeyStreamFirstSeq(0), KeyStreamFirstSeq(MaxKeyStreams-1))
	}
}
