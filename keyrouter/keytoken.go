package keyrouter

import "strings"

const upperHex = "0123456789ABCDEF"

// keySafe are the bytes a key keeps as they are: readable keys such as
// "user-123", "users:42" or "tenant/a@b" stay readable in subjects. Every
// other byte, '%' included, is written as %XX.
func keySafe(c byte) bool {
	if isAlnum(c) {
		return true
	}
	switch c {
	case '-', '_', ':', '@', '=', '+', ',', '!', '~', '/':
		return true
	}
	return false
}

// EncodeKey percent-encodes key: bytes outside [A-Za-z0-9-_:@=+,!~/] become
// %XX. The result holds no '.', '*', '>', whitespace, control or non-ASCII
// byte, so it is both a safe subject token and a safe NATS header value, and
// DecodeKey(EncodeKey(k)) == k for every k.
func EncodeKey(key string) string {
	n := 0
	for i := 0; i < len(key); i++ {
		if !keySafe(key[i]) {
			n++
		}
	}
	if n == 0 {
		return key
	}
	var b strings.Builder
	b.Grow(len(key) + 2*n)
	for i := 0; i < len(key); i++ {
		c := key[i]
		if keySafe(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&15])
	}
	return b.String()
}

// DecodeKey reverses EncodeKey. It accepts upper- or lower-case hex and
// returns ErrInvalidEncoding for a '%' not followed by two hex digits.
func DecodeKey(s string) (string, error) {
	if strings.IndexByte(s, '%') < 0 {
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", ErrInvalidEncoding
		}
		hi, ok1 := unhex(s[i+1])
		lo, ok2 := unhex(s[i+2])
		if !ok1 || !ok2 {
			return "", ErrInvalidEncoding
		}
		b = append(b, hi<<4|lo)
		i += 2
	}
	return string(b), nil
}

// KeyToken is the subject token of an ordering key: EncodeKey(key) when that
// is at most MaxTokenBytes long, otherwise "%%" followed by the base32 of the
// key's SHA-256. EncodeKey never writes "%%", so the two forms never meet:
// two keys share a token only if both are in hash form and their SHA-256
// digests are equal. Such a collision would merge two keys' orders into one
// (still ordered) sequence; it never reorders anything.
func KeyToken(key string) string {
	enc := EncodeKey(key)
	if len(enc) <= MaxTokenBytes {
		return enc
	}
	return hashTokenMark + hashString(key)
}

// IsHashToken reports whether a token is in the hash form.
func IsHashToken(token string) bool { return strings.HasPrefix(token, hashTokenMark) }

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
