package iam

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"maps"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var jwtTestNow = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

const jwtTestIssuer = "https://issuer.example"

// jwtTestKeys are the signing keys of the tests; the set written to file
// holds the public halves of all but the forgers.
type jwtTestKeys struct {
	file                 string
	rsa1, rsa2, rsaForg  *rsa.PrivateKey
	ec256, ec384, ecForg *ecdsa.PrivateKey
	ed                   ed25519.PrivateKey
}

func jwtTestSetup(t *testing.T) *jwtTestKeys {
	t.Helper()
	k := &jwtTestKeys{}
	for _, p := range []**rsa.PrivateKey{&k.rsa1, &k.rsa2, &k.rsaForg} {
		var err error
		if *p, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		p     **ecdsa.PrivateKey
		curve elliptic.Curve
	}{{&k.ec256, elliptic.P256()}, {&k.ec384, elliptic.P384()}, {&k.ecForg, elliptic.P256()}} {
		var err error
		if *c.p, err = ecdsa.GenerateKey(c.curve, rand.Reader); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if _, k.ed, err = ed25519.GenerateKey(rand.Reader); err != nil {
		t.Fatal(err)
	}
	k.file = jwtTestWriteJWKS(t, []map[string]any{
		jwtTestJWK(t, "rsa1", &k.rsa1.PublicKey, map[string]any{"alg": "RS256", "use": "sig"}),
		jwtTestJWK(t, "rsa2", &k.rsa2.PublicKey, nil),
		jwtTestJWK(t, "enc1", &k.rsa2.PublicKey, map[string]any{"use": "enc"}),
		jwtTestJWK(t, "ec256", &k.ec256.PublicKey, nil),
		jwtTestJWK(t, "ec384", &k.ec384.PublicKey, nil),
		jwtTestJWK(t, "ed1", k.ed.Public(), nil),
	})
	return k
}

// jwtTestJWK is pub as a JWK, with extra members.
func jwtTestJWK(t *testing.T, kid string, pub crypto.PublicKey, extra map[string]any) map[string]any {
	b64 := base64.RawURLEncoding.EncodeToString
	jwk := map[string]any{"kid": kid}
	switch pub := pub.(type) {
	case *rsa.PublicKey:
		jwk["kty"], jwk["n"], jwk["e"] = "RSA", b64(pub.N.Bytes()), b64(big.NewInt(int64(pub.E)).Bytes())
	case *ecdsa.PublicKey:
		point, err := pub.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		size := (len(point) - 1) / 2
		jwk["kty"], jwk["crv"] = "EC", pub.Curve.Params().Name
		jwk["x"], jwk["y"] = b64(point[1:1+size]), b64(point[1+size:])
	case ed25519.PublicKey:
		jwk["kty"], jwk["crv"], jwk["x"] = "OKP", "Ed25519", b64(pub)
	}
	maps.Copy(jwk, extra)
	return jwk
}

func jwtTestWriteJWKS(t *testing.T, keys []map[string]any) string {
	t.Helper()
	b, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		t.Fatal(err)
	}
	return jwtTestWriteFile(t, string(b))
}

func jwtTestWriteFile(t *testing.T, content string) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(file, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// jwtTestToken describes a token to sign.
type jwtTestToken struct {
	alg, kid string
	// key is an *rsa.PrivateKey, *ecdsa.PrivateKey, ed25519.PrivateKey,
	// []byte (an HMAC secret) or nil (no signature).
	key     any
	header  map[string]any       // more header members
	claims  func(map[string]any) // changes to the default claims
	payload string               // when set, the payload instead of the claims
}

func jwtTestB64JSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// jwtTestSign makes tok: by default a Kubernetes-like token for audience
// "jetorder", valid at jwtTestNow.
func jwtTestSign(t *testing.T, tok jwtTestToken) string {
	t.Helper()
	h := map[string]any{"alg": tok.alg, "typ": "JWT"}
	if tok.kid != "" {
		h["kid"] = tok.kid
	}
	maps.Copy(h, tok.header)
	c := map[string]any{
		"iss": jwtTestIssuer,
		"aud": "jetorder",
		"sub": "system:serviceaccount:ns:name",
		"iat": jwtTestNow.Add(-time.Minute).Unix(),
		"exp": jwtTestNow.Add(time.Hour).Unix(),
	}
	if tok.claims != nil {
		tok.claims(c)
	}
	payload := jwtTestB64JSON(t, c)
	if tok.payload != "" {
		payload = base64.RawURLEncoding.EncodeToString([]byte(tok.payload))
	}
	input := jwtTestB64JSON(t, h) + "." + payload
	return input + "." + base64.RawURLEncoding.EncodeToString(jwtTestSignature(t, tok.alg, tok.key, []byte(input)))
}

func jwtTestSignature(t *testing.T, alg string, key any, input []byte) []byte {
	t.Helper()
	hash := map[string]crypto.Hash{"256": crypto.SHA256, "384": crypto.SHA384, "512": crypto.SHA512}[alg[max(len(alg)-3, 0):]]
	var digest []byte
	if hash != 0 {
		h := hash.New()
		h.Write(input)
		digest = h.Sum(nil)
	}
	var sig []byte
	var err error
	switch key := key.(type) {
	case nil:
	case []byte:
		m := hmac.New(sha256.New, key)
		m.Write(input)
		sig = m.Sum(nil)
	case *rsa.PrivateKey:
		if strings.HasPrefix(alg, "PS") {
			sig, err = rsa.SignPSS(rand.Reader, key, hash, digest, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
		} else {
			sig, err = rsa.SignPKCS1v15(rand.Reader, key, hash, digest)
		}
	case *ecdsa.PrivateKey:
		var r, s *big.Int
		r, s, err = ecdsa.Sign(rand.Reader, key, digest)
		if err == nil {
			size := (key.Curve.Params().BitSize + 7) / 8
			sig = make([]byte, 2*size)
			r.FillBytes(sig[:size])
			s.FillBytes(sig[size:])
		}
	case ed25519.PrivateKey:
		sig = ed25519.Sign(key, input)
	default:
		t.Fatalf("no signing with %T", key)
	}
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

func TestJWTVerify(t *testing.T) {
	k := jwtTestSetup(t)
	v, err := NewJWTVerifier(JWTConfig{JWKSFile: k.file, Issuer: jwtTestIssuer, Audiences: []string{"jetorder", "jetorder-dev"}})
	if err != nil {
		t.Fatal(err)
	}
	sign := func(tok jwtTestToken) string { return jwtTestSign(t, tok) }
	set := func(kv ...any) func(map[string]any) {
		return func(c map[string]any) {
			for i := 0; i < len(kv); i += 2 {
				c[kv[i].(string)] = kv[i+1]
			}
		}
	}
	without := func(names ...string) func(map[string]any) {
		return func(c map[string]any) {
			for _, n := range names {
				delete(c, n)
			}
		}
	}
	at := func(d time.Duration) int64 { return jwtTestNow.Add(d).Unix() }

	valid := sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1})
	vp := strings.Split(valid, ".")
	tampered := vp[0] + "." + jwtTestB64JSON(t, map[string]any{
		"iss": jwtTestIssuer, "aud": "jetorder", "sub": "system:serviceaccount:kube-system:admin", "exp": at(time.Hour),
	}) + "." + vp[2]
	sigBytes, err := base64.RawURLEncoding.DecodeString(vp[2])
	if err != nil {
		t.Fatal(err)
	}
	cut := vp[0] + "." + vp[1] + "." + base64.RawURLEncoding.EncodeToString(sigBytes[:len(sigBytes)-1])
	pubDER, err := x509.MarshalPKIXPublicKey(&k.rsa1.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})

	for _, tc := range []struct {
		name, token string
		want        string // the principal, when the token is good
		wantErr     string // part of the error, when it is not
	}{
		// Good tokens and the principals they name.
		{name: "RS256 Kubernetes service account", token: valid, want: "serviceAccount:system:serviceaccount:ns:name"},
		{name: "ES256 Google service account", token: sign(jwtTestToken{alg: "ES256", kid: "ec256", key: k.ec256,
			claims: set("email", "builder@proj.iam.gserviceaccount.com", "email_verified", true, "sub", "1234")}),
			want: "serviceAccount:builder@proj.iam.gserviceaccount.com"},
		{name: "RS256 user, email verified", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1,
			claims: set("email", "alice@example.com", "email_verified", true, "sub", "1234")}),
			want: "user:alice@example.com"},
		{name: "ES256 user, email_verified absent", token: sign(jwtTestToken{alg: "ES256", kid: "ec256", key: k.ec256,
			claims: set("email", "alice@example.com")}), want: "user:alice@example.com"},
		{name: "email_verified as a string", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1,
			claims: set("email", "alice@example.com", "email_verified", "true")}), want: "user:alice@example.com"},
		{name: "PS256", token: sign(jwtTestToken{alg: "PS256", kid: "rsa2", key: k.rsa2}), want: "serviceAccount:system:serviceaccount:ns:name"},
		{name: "RS512 without kid", token: sign(jwtTestToken{alg: "RS512", key: k.rsa2}), want: "serviceAccount:system:serviceaccount:ns:name"},
		{name: "ES384 without kid", token: sign(jwtTestToken{alg: "ES384", key: k.ec384}), want: "serviceAccount:system:serviceaccount:ns:name"},
		{name: "EdDSA", token: sign(jwtTestToken{alg: "EdDSA", kid: "ed1", key: k.ed}), want: "serviceAccount:system:serviceaccount:ns:name"},
		{name: "aud array naming one", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1,
			claims: set("aud", []string{"other", "jetorder-dev"})}), want: "serviceAccount:system:serviceaccount:ns:name"},
		{name: "expired within leeway", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1,
			claims: set("exp", at(-30*time.Second))}), want: "serviceAccount:system:serviceaccount:ns:name"},
		{name: "nbf within leeway", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1,
			claims: set("nbf", at(30*time.Second), "iat", at(30*time.Second))}), want: "serviceAccount:system:serviceaccount:ns:name"},
		{name: "fractional exp", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1,
			claims: set("exp", float64(at(time.Hour))+0.5)}), want: "serviceAccount:system:serviceaccount:ns:name"},

		// Principals refused.
		{name: "email not verified", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1,
			claims: set("email", "alice@example.com", "email_verified", false)}), wantErr: `email "alice@example.com" is not verified`},
		{name: "no email or sub", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, claims: without("sub")}),
			wantErr: "no email or sub claim"},

		// Signatures refused.
		{name: "forged, kid of a key of the set", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsaForg}),
			wantErr: "signature does not verify"},
		{name: "forged, no kid", token: sign(jwtTestToken{alg: "RS256", key: k.rsaForg}), wantErr: "signature does not verify"},
		{name: "forged ES256", token: sign(jwtTestToken{alg: "ES256", kid: "ec256", key: k.ecForg}), wantErr: "signature does not verify"},
		{name: "tampered payload", token: tampered, wantErr: "signature does not verify"},
		{name: "signature cut short", token: cut, wantErr: "signature does not verify"},
		{name: "alg none", token: sign(jwtTestToken{alg: "none", kid: "rsa1"}), wantErr: `alg "none" is refused`},
		{name: "no alg", token: sign(jwtTestToken{alg: "", kid: "rsa1"}), wantErr: "no alg"},
		{name: "HS256 keyed with the RSA public key", token: sign(jwtTestToken{alg: "HS256", kid: "rsa1", key: pubPEM}),
			wantErr: `alg "HS256" is refused`},
		{name: "unknown alg", token: sign(jwtTestToken{alg: "XS256", kid: "rsa1", key: k.rsa1}), wantErr: `unsupported token alg "XS256"`},
		{name: "crit header", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, header: map[string]any{"crit": []string{"exp"}}}),
			wantErr: `"crit"`},
		{name: "unknown kid", token: sign(jwtTestToken{alg: "RS256", kid: "nope", key: k.rsa1}), wantErr: `kid "nope" names no key of ` + k.file},
		{name: "key alg mismatch", token: sign(jwtTestToken{alg: "RS384", kid: "rsa1", key: k.rsa1}),
			wantErr: `key "rsa1" is for alg RS256, not the token's RS384`},
		{name: "key type mismatch", token: sign(jwtTestToken{alg: "ES256", kid: "rsa2", key: k.ec256}), wantErr: `key "rsa2" is an RSA key`},
		{name: "curve mismatch", token: sign(jwtTestToken{alg: "ES256", kid: "ec384", key: k.ec256}),
			wantErr: `key "ec384" is an EC P-384 key, not one for alg ES256`},
		{name: "key for encryption", token: sign(jwtTestToken{alg: "RS256", kid: "enc1", key: k.rsa2}), wantErr: `key "enc1" is for use "enc"`},
		{name: "no key for the alg", token: sign(jwtTestToken{alg: "ES512", key: k.ec256}), wantErr: "no key of " + k.file + " fits alg ES512"},

		// Claims refused.
		{name: "expired", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, claims: set("exp", at(-2*time.Minute))}),
			wantErr: "token expired at 2026-05-01T11:58:00Z"},
		{name: "no exp", token: sign(jwtTestToken{alg: "ES256", kid: "ec256", key: k.ec256, claims: without("exp")}), wantErr: "no exp claim"},
		{name: "exp not a number", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, claims: set("exp", "tomorrow")}),
			wantErr: `claim "exp"`},
		{name: "nbf in the future", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, claims: set("nbf", at(5*time.Minute))}),
			wantErr: "token not valid before 2026-05-01T12:05:00Z"},
		{name: "iat in the future", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, claims: set("iat", at(5*time.Minute))}),
			wantErr: "token issued in the future, at 2026-05-01T12:05:00Z"},
		{name: "wrong audience", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, claims: set("aud", "other")}),
			wantErr: `audience ["other"] is not one of ["jetorder" "jetorder-dev"]`},
		{name: "wrong audiences", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, claims: set("aud", []string{"a", "b"})}),
			wantErr: `audience ["a" "b"] is not one of`},
		{name: "no audience", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, claims: without("aud")}), wantErr: "no aud claim"},
		{name: "wrong issuer", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, claims: set("iss", "https://evil.example")}),
			wantErr: `issuer "https://evil.example" is not "https://issuer.example"`},
		{name: "no issuer", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, claims: without("iss")}),
			wantErr: `issuer "" is not`},

		// Malformed tokens.
		{name: "empty", token: "", wantErr: "1 parts, not 3"},
		{name: "two parts", token: vp[0] + "." + vp[1], wantErr: "2 parts, not 3"},
		{name: "four parts", token: valid + ".x", wantErr: "4 parts, not 3"},
		{name: "header not base64url", token: "!!!." + vp[1] + "." + vp[2], wantErr: "header is not base64url"},
		{name: "header not JSON", token: base64.RawURLEncoding.EncodeToString([]byte("not json")) + "." + vp[1] + "." + vp[2],
			wantErr: "header is not a JSON object"},
		{name: "signature not base64url", token: vp[0] + "." + vp[1] + ".a+b/", wantErr: "signature is not base64url"},
		{name: "padded signature", token: valid + "==", wantErr: "signature is not base64url"},
		{name: "signed payload not JSON", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, payload: "[1,2]"}),
			wantErr: "payload is not a JSON object"},
		{name: "oversized", token: sign(jwtTestToken{alg: "RS256", kid: "rsa1", key: k.rsa1, header: map[string]any{"pad": strings.Repeat("a", 16<<10)}}),
			wantErr: "over the 16384-byte limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := v.Verify(tc.token, jwtTestNow)
			if tc.wantErr == "" {
				if err != nil || got != tc.want {
					t.Fatalf("Verify = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("Verify = %q, nil; want an error with %q", got, tc.wantErr)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Verify error %q; want one with %q", err, tc.wantErr)
			}
			// Errors may be logged: they must not carry the token.
			for _, part := range strings.Split(tc.token, ".") {
				if len(part) >= 16 && strings.Contains(err.Error(), part) {
					t.Fatalf("Verify error %q echoes the token", err)
				}
			}
		})
	}
}

func TestNewJWTVerifierErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.json")
	ff := base64.RawURLEncoding.EncodeToString([]byte(strings.Repeat("\xff", 128)))
	ones := base64.RawURLEncoding.EncodeToString([]byte(strings.Repeat("\x01", 32)))
	for _, tc := range []struct {
		name      string
		jwks      string // file content; "" for the missing file
		audiences []string
		wantErr   string
	}{
		{name: "missing file", audiences: []string{"a"}, wantErr: "no such file"},
		{name: "empty set", jwks: `{"keys":[]}`, audiences: []string{"a"}, wantErr: "no keys"},
		{name: "not JSON", jwks: `<html>`, audiences: []string{"a"}, wantErr: "not a JSON Web Key Set"},
		{name: "no audience", jwks: `{"keys":[]}`, wantErr: "no audience configured"},
		{name: "empty audience", jwks: `{"keys":[]}`, audiences: []string{""}, wantErr: "no audience configured"},
		{name: "unsupported kty", jwks: `{"keys":[{"kty":"oct","kid":"s","k":"c2VjcmV0"}]}`, audiences: []string{"a"},
			wantErr: `key 0 (kid "s"): unsupported kty "oct"`},
		{name: "bad base64", jwks: `{"keys":[{"kty":"RSA","kid":"r","n":"a+b/","e":"AQAB"}]}`, audiences: []string{"a"},
			wantErr: `bad base64 in "n"`},
		{name: "RSA key too small", jwks: `{"keys":[{"kty":"RSA","n":"` + ff + `","e":"AQAB"}]}`, audiences: []string{"a"},
			wantErr: "RSA key of 1024 bits"},
		{name: "EC point off the curve", jwks: `{"keys":[{"kty":"EC","crv":"P-256","x":"` + ones + `","y":"` + ones + `"}]}`,
			audiences: []string{"a"}, wantErr: "invalid P-256 point"},
		{name: "unsupported curve", jwks: `{"keys":[{"kty":"EC","crv":"secp256k1","x":"` + ones + `","y":"` + ones + `"}]}`,
			audiences: []string{"a"}, wantErr: `unsupported EC crv "secp256k1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := missing
			if tc.jwks != "" {
				file = jwtTestWriteFile(t, tc.jwks)
			}
			_, err := NewJWTVerifier(JWTConfig{JWKSFile: file, Audiences: tc.audiences})
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("NewJWTVerifier error %v; want one with %q", err, tc.wantErr)
			}
			if !strings.Contains(err.Error(), file) {
				t.Fatalf("NewJWTVerifier error %q does not name %s", err, file)
			}
		})
	}
	if _, err := NewJWTVerifier(JWTConfig{Audiences: []string{"a"}}); err == nil || !strings.Contains(err.Error(), "no JWKS file") {
		t.Fatalf("NewJWTVerifier without a file: %v", err)
	}
}

func TestLooksLikeJWT(t *testing.T) {
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	header := b64(`{"alg":"RS256","kid":"k"}`)
	payload := b64(`{"sub":"x"}`)
	sig := b64("0123456789abcdef")
	for _, tc := range []struct {
		name, token string
		want        bool
	}{
		{"signed", header + "." + payload + "." + sig, true},
		{"unsigned", b64(`{"alg":"none"}`) + "." + payload + ".", true},
		{"empty", "", false},
		{"opaque access token", "ya29.a0AfH6SMBxExampleOpaqueToken", false},
		{"opaque with three dotted parts", "ya29.abcd.efgh", false},
		{"header without alg", b64(`{"typ":"JWT"}`) + "." + payload + "." + sig, false},
		{"header an array", b64(`["alg"]`) + "." + payload + "." + sig, false},
		{"header not JSON", b64("alg") + "." + payload + "." + sig, false},
		{"empty payload", header + ".." + sig, false},
		{"four parts", header + "." + payload + "." + sig + "." + sig, false},
		{"standard base64", header + "." + payload + ".ab+/", false},
		{"oversized", header + "." + b64(strings.Repeat("x", 16<<10)) + "." + sig, false},
	} {
		if got := LooksLikeJWT(tc.token); got != tc.want {
			t.Errorf("%s: LooksLikeJWT = %v, want %v", tc.name, got, tc.want)
		}
	}
}
