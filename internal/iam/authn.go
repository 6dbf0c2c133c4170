package iam

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// Caller is who makes a call.
type Caller struct {
	// Principal is "user:…" or "serviceAccount:…"; "" for a caller
	// without credentials.
	Principal string
	// Via is how the principal was authenticated: "token", "jwt" or
	// "mtls"; "" without credentials.
	Via string
}

type callerKey struct{}

// WithCaller returns ctx carrying c.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf returns the caller ctx carries; the zero Caller (no
// credentials) when it carries none.
func CallerOf(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// minTokenLength keeps guessable tokens out of a token file.
const minTokenLength = 16

// tokenSet holds a token file's tokens by their SHA-256: only hashes are
// kept, so a heap dump shows no token.
type tokenSet map[[sha256.Size]byte]string // hash → principal

// loadTokens reads a token file: one "PRINCIPAL TOKEN" or
// "PRINCIPAL sha256:HEX" per line; blank lines and lines starting with #
// are skipped.
func loadTokens(path string) (tokenSet, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	set := tokenSet{}
	line := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		fields := strings.Fields(text)
		if len(fields) != 2 {
			return nil, fmt.Errorf("%s:%d: want PRINCIPAL TOKEN or PRINCIPAL sha256:HEX", path, n)
		}
		principal, secret := fields[0], fields[1]
		if err := validPrincipal(principal); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		var hash [sha256.Size]byte
		if h, ok := strings.CutPrefix(secret, "sha256:"); ok {
			b, err := hex.DecodeString(h)
			if err != nil || len(b) != sha256.Size {
				return nil, fmt.Errorf("%s:%d: sha256: wants 64 hex digits", path, n)
			}
			copy(hash[:], b)
		} else {
			if len(secret) < minTokenLength {
				return nil, fmt.Errorf("%s:%d: the token of %s is shorter than %d characters", path, n, principal, minTokenLength)
			}
			hash = sha256.Sum256([]byte(secret))
		}
		if first, dup := line[hash]; dup {
			return nil, fmt.Errorf("%s:%d: the same token as line %d", path, n, first)
		}
		line[hash], set[hash] = n, principal
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(set) == 0 {
		return nil, fmt.Errorf("%s: no tokens", path)
	}
	return set, nil
}

// principal returns the principal of token, or "". It looks the token up
// by its SHA-256, so the time it takes does not grow with the file: what
// the lookup's timing could tell is about the hash, from which the token
// cannot be found (the constant-time comparison of every entry it
// replaced cost 19 µs a call with 1,000 tokens, docs/BENCHMARKS.md).
func (s tokenSet) principal(token string) string {
	return s[sha256.Sum256([]byte(token))]
}

// certPrincipal is the principal a verified client certificate names: its
// Subject CommonName when that is already a principal ("user:…",
// "serviceAccount:…"); else "user:" and its first email address; else
// "serviceAccount:" and its CommonName (a workload's certificate).
func certPrincipal(c *x509.Certificate) (string, error) {
	cn := c.Subject.CommonName
	if validPrincipal(cn) == nil {
		return cn, nil
	}
	if len(c.EmailAddresses) > 0 {
		return "user:" + c.EmailAddresses[0], nil
	}
	if cn != "" && !strings.ContainsAny(cn, " \t") {
		return "serviceAccount:" + cn, nil
	}
	return "", errors.New("the client certificate names no principal (no CommonName, no email address)")
}

// presented is what a request presents to authenticate.
type presented struct {
	bearer    string // the Authorization header's token; "" for none
	badHeader bool   // an Authorization header that is not "Bearer TOKEN"
	chains    [][]*x509.Certificate
}

// parseAuthorization reads an Authorization header value.
func parseAuthorization(v string) (token string, ok bool) {
	scheme, token, found := strings.Cut(strings.TrimSpace(v), " ")
	if !found || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// authenticate returns the caller the credentials name. No credentials is
// the anonymous caller, not an error: a policy may grant allUsers. Bad
// credentials are an error, whose text is for the audit log; the client
// gets Google's text (errInvalidCredentials).
func (g *Guard) authenticate(c presented) (Caller, error) {
	switch {
	case c.badHeader:
		return Caller{}, errors.New(`the Authorization header is not "Bearer TOKEN"`)
	case c.bearer != "":
		if g.jwt != nil && LooksLikeJWT(c.bearer) {
			p, err := g.jwt.Verify(c.bearer, time.Now())
			if err != nil {
				return Caller{}, fmt.Errorf("JWT: %w", err)
			}
			return Caller{Principal: p, Via: "jwt"}, nil
		}
		if p := g.tokens.principal(c.bearer); p != "" {
			return Caller{Principal: p, Via: "token"}, nil
		}
		return Caller{}, errors.New("unknown bearer token")
	case g.mtls && len(c.chains) > 0 && len(c.chains[0]) > 0:
		p, err := certPrincipal(c.chains[0][0])
		if err != nil {
			return Caller{}, err
		}
		return Caller{Principal: p, Via: "mtls"}, nil
	}
	return Caller{}, nil
}
