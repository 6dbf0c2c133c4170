package iam

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	_ "crypto/sha256" // registers SHA-256 for crypto.Hash.New
	_ "crypto/sha512" // registers SHA-384 and SHA-512
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"os"
	"slices"
	"strings"
	"time"
)

const (
	// jwtMaxTokenSize bounds what Verify and LooksLikeJWT will decode: real
	// ID tokens are 1-2 KiB, and a bound keeps a hostile header cheap.
	jwtMaxTokenSize = 16 << 10
	// jwtDefaultLeeway is the clock skew allowed when JWTConfig.Leeway is 0.
	jwtDefaultLeeway = time.Minute
	// jwtMinRSABits is the smallest RSA key accepted (RFC 7518 §3.3).
	jwtMinRSABits = 2048
)

// JWTConfig configures JWT verification.
type JWTConfig struct {
	// JWKSFile is a JSON Web Key Set file ({"keys":[...]}), e.g. a
	// Kubernetes cluster's /openid/v1/jwks.
	JWKSFile string
	// Issuer, when not empty, is the "iss" every token must carry.
	Issuer string
	// Audiences are the names this service answers to: a token's "aud"
	// must name one of them. At least one is required, or any token from
	// the issuer, meant for any service, would be accepted.
	Audiences []string
	// Leeway is the clock skew allowed on exp, nbf and iat; 0 means 1 minute.
	Leeway time.Duration
}

// JWTVerifier verifies JWTs signed by a key of the set.
type JWTVerifier struct {
	file      string
	keys      []jwtKey
	issuer    string
	audiences []string
	leeway    time.Duration
}

// jwtKey is one public key of the set.
type jwtKey struct {
	kid string
	alg string // "" when the JWK leaves it open
	use string // "" when the JWK leaves it open
	pub crypto.PublicKey
}

// jwtAlg is how one JWS "alg" verifies.
type jwtAlg struct {
	kind  string // "RS" (PKCS #1 v1.5), "PS" (PSS), "ES" (ECDSA) or "EdDSA"
	hash  crypto.Hash
	curve elliptic.Curve // the one curve an ES alg is defined on
}

var jwtAlgs = map[string]jwtAlg{
	"RS256": {"RS", crypto.SHA256, nil},
	"RS384": {"RS", crypto.SHA384, nil},
	"RS512": {"RS", crypto.SHA512, nil},
	"PS256": {"PS", crypto.SHA256, nil},
	"PS384": {"PS", crypto.SHA384, nil},
	"PS512": {"PS", crypto.SHA512, nil},
	"ES256": {"ES", crypto.SHA256, elliptic.P256()},
	"ES384": {"ES", crypto.SHA384, elliptic.P384()},
	"ES512": {"ES", crypto.SHA512, elliptic.P521()},
	"EdDSA": {"EdDSA", 0, nil},
}

// jwtB64 decodes base64url without padding, strictly: a lax decoder
// accepts several encodings of one signature, which makes tokens malleable.
var jwtB64 = base64.RawURLEncoding.Strict()

// NewJWTVerifier reads and parses c.JWKSFile.
func NewJWTVerifier(c JWTConfig) (*JWTVerifier, error) {
	if c.JWKSFile == "" {
		return nil, errors.New("JWT verification: no JWKS file configured")
	}
	if len(c.Audiences) == 0 || slices.Contains(c.Audiences, "") {
		return nil, fmt.Errorf("JWT verification with %s: no audience configured (or an empty one); "+
			"without one, tokens meant for any other service would be accepted", c.JWKSFile)
	}
	if c.Leeway < 0 {
		return nil, fmt.Errorf("JWT verification with %s: negative leeway %v", c.JWKSFile, c.Leeway)
	}
	if c.Leeway == 0 {
		c.Leeway = jwtDefaultLeeway
	}
	data, err := os.ReadFile(c.JWKSFile)
	if err != nil {
		return nil, fmt.Errorf("reading JWKS: %w", err)
	}
	keys, err := jwtParseJWKS(data)
	if err != nil {
		return nil, fmt.Errorf("JWKS %s: %w", c.JWKSFile, err)
	}
	return &JWTVerifier{
		file:      c.JWKSFile,
		keys:      keys,
		issuer:    c.Issuer,
		audiences: slices.Clone(c.Audiences),
		leeway:    c.Leeway,
	}, nil
}

func jwtParseJWKS(data []byte) ([]jwtKey, error) {
	var set struct {
		Keys []struct {
			Kty, Kid, Use, Alg string
			N, E               string // RSA
			Crv, X, Y          string // EC and OKP
		} `json:"keys"`
	}
	if err := json.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("not a JSON Web Key Set: %v", err)
	}
	if len(set.Keys) == 0 {
		return nil, errors.New(`no keys (want {"keys":[...]})`)
	}
	keys := make([]jwtKey, 0, len(set.Keys))
	for i, k := range set.Keys {
		var pub crypto.PublicKey
		var err error
		switch k.Kty {
		case "RSA":
			pub, err = jwtRSAKey(k.N, k.E)
		case "EC":
			pub, err = jwtECKey(k.Crv, k.X, k.Y)
		case "OKP":
			pub, err = jwtOKPKey(k.Crv, k.X)
		default:
			err = fmt.Errorf("unsupported kty %q", k.Kty)
		}
		if err != nil {
			return nil, fmt.Errorf("key %d (kid %q): %w", i, k.Kid, err)
		}
		keys = append(keys, jwtKey{kid: k.Kid, alg: k.Alg, use: k.Use, pub: pub})
	}
	return keys, nil
}

// jwtField decodes one base64url member of a JWK.
func jwtField(name, value string) ([]byte, error) {
	if value == "" {
		return nil, fmt.Errorf("no %q", name)
	}
	b, err := jwtB64.DecodeString(value)
	if err != nil {
		return nil, fmt.Errorf("bad base64 in %q: %v", name, err)
	}
	return b, nil
}

func jwtRSAKey(n64, e64 string) (*rsa.PublicKey, error) {
	n, err := jwtField("n", n64)
	if err != nil {
		return nil, err
	}
	e, err := jwtField("e", e64)
	if err != nil {
		return nil, err
	}
	if len(e) > 4 {
		return nil, fmt.Errorf("exponent of %d bytes is too large", len(e))
	}
	pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
	if bits := pub.N.BitLen(); bits < jwtMinRSABits {
		return nil, fmt.Errorf("RSA key of %d bits; at least %d are required", bits, jwtMinRSABits)
	}
	if pub.E < 3 || pub.E%2 == 0 {
		return nil, fmt.Errorf("invalid RSA exponent %d", pub.E)
	}
	return pub, nil
}

func jwtECKey(crv, x64, y64 string) (*ecdsa.PublicKey, error) {
	var curve elliptic.Curve
	switch crv {
	case "P-256":
		curve = elliptic.P256()
	case "P-384":
		curve = elliptic.P384()
	case "P-521":
		curve = elliptic.P521()
	default:
		return nil, fmt.Errorf("unsupported EC crv %q", crv)
	}
	x, err := jwtField("x", x64)
	if err != nil {
		return nil, err
	}
	y, err := jwtField("y", y64)
	if err != nil {
		return nil, err
	}
	size := (curve.Params().BitSize + 7) / 8
	if len(x) != size || len(y) != size {
		return nil, fmt.Errorf("%s coordinates must be %d bytes, not %d and %d", crv, size, len(x), len(y))
	}
	// The uncompressed point encoding; parsing it checks the point is on
	// the curve, so an invalid-curve key is refused here, not used later.
	pub, err := ecdsa.ParseUncompressedPublicKey(curve, slices.Concat([]byte{4}, x, y))
	if err != nil {
		return nil, fmt.Errorf("invalid %s point: %v", crv, err)
	}
	return pub, nil
}

func jwtOKPKey(crv, x64 string) (ed25519.PublicKey, error) {
	if crv != "Ed25519" {
		return nil, fmt.Errorf("unsupported OKP crv %q", crv)
	}
	x, err := jwtField("x", x64)
	if err != nil {
		return nil, err
	}
	if len(x) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("Ed25519 key of %d bytes, not %d", len(x), ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(x), nil
}

// jwtObject is a JSON object's members by exact name: encoding/json matches
// struct fields case-insensitively, and "Exp" is not "exp".
type jwtObject map[string]json.RawMessage

// get decodes member name into v, reporting whether it is there; a null
// member counts as absent.
func (o jwtObject) get(name string, v any) (bool, error) {
	raw, ok := o[name]
	if !ok || string(raw) == "null" {
		return false, nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return true, fmt.Errorf("claim %q: %v", name, err)
	}
	return true, nil
}

// jwtDecodeObject decodes a base64url JSON object, one part of a token.
func jwtDecodeObject(part, what string) (jwtObject, error) {
	b, err := jwtB64.DecodeString(part)
	if err != nil {
		return nil, fmt.Errorf("malformed token: %s is not base64url: %v", what, err)
	}
	var o jwtObject
	if err := json.Unmarshal(b, &o); err != nil || o == nil {
		return nil, fmt.Errorf("malformed token: %s is not a JSON object", what)
	}
	return o, nil
}

// jwtQuote quotes a string from an unverified header for an error message,
// cut short: the header is the sender's to fill.
func jwtQuote(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return fmt.Sprintf("%q", s)
}

// LooksLikeJWT reports whether a bearer token has the shape of a JWT
// (three base64url parts, the first decoding to a JSON header with "alg"),
// so that callers can tell JWTs from opaque tokens.
func LooksLikeJWT(token string) bool {
	if len(token) > jwtMaxTokenSize {
		return false
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[1] == "" {
		return false
	}
	if _, err := jwtB64.DecodeString(parts[1]); err != nil {
		return false
	}
	// The signature may be empty: an unsigned token is still a JWT, and
	// should reach Verify to be refused as one.
	if _, err := jwtB64.DecodeString(parts[2]); err != nil {
		return false
	}
	h, err := jwtDecodeObject(parts[0], "header")
	if err != nil {
		return false
	}
	var alg string
	ok, err := h.get("alg", &alg)
	return ok && err == nil && alg != ""
}

// Verify checks token's signature, alg, exp (required), nbf, iat, iss and
// aud at time now, and returns the principal it names:
// "serviceAccount:<email>" when an "email" claim ends in
// ".gserviceaccount.com", "user:<email>" for another email claim, otherwise
// "serviceAccount:<sub>" (e.g. Kubernetes "system:serviceaccount:ns:name").
// A token whose email_verified claim is present and not true is refused.
//
// Errors say what was wrong without echoing the token.
func (v *JWTVerifier) Verify(token string, now time.Time) (principal string, err error) {
	if len(token) > jwtMaxTokenSize {
		return "", fmt.Errorf("token of %d bytes is over the %d-byte limit", len(token), jwtMaxTokenSize)
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return "", fmt.Errorf("malformed token: %d parts, not 3", len(parts))
	}
	header, err := jwtDecodeObject(parts[0], "header")
	if err != nil {
		return "", err
	}
	var algName, kid string
	if _, err := header.get("alg", &algName); err != nil {
		return "", fmt.Errorf("malformed token header: %v", err)
	}
	if _, err := header.get("kid", &kid); err != nil {
		return "", fmt.Errorf("malformed token header: %v", err)
	}
	// crit names extensions the verifier must understand (RFC 7515 §4.1.11);
	// this one understands none.
	if _, ok := header["crit"]; ok {
		return "", errors.New(`token header has "crit": no extensions are supported`)
	}
	alg, ok := jwtAlgs[algName]
	switch {
	case algName == "":
		return "", errors.New("token header has no alg")
	case strings.EqualFold(algName, "none"):
		return "", errors.New(`token alg "none" is refused: the token is unsigned`)
	case strings.HasPrefix(strings.ToUpper(algName), "HS"):
		// With HMAC the "secret" would be a public key anyone can fetch:
		// the classic alg-confusion forgery.
		return "", fmt.Errorf("token alg %s is refused: HMAC is never accepted with public keys", jwtQuote(algName))
	case !ok:
		return "", fmt.Errorf("unsupported token alg %s", jwtQuote(algName))
	}
	sig, err := jwtB64.DecodeString(parts[2])
	if err != nil {
		return "", fmt.Errorf("malformed token: signature is not base64url: %v", err)
	}
	if err := v.verifySignature(algName, alg, kid, []byte(parts[0]+"."+parts[1]), sig); err != nil {
		return "", err
	}
	// Only now, with the signature good, are the claims worth reading.
	claims, err := jwtDecodeObject(parts[1], "payload")
	if err != nil {
		return "", err
	}
	if err := v.checkClaims(claims, now); err != nil {
		return "", err
	}
	return jwtPrincipal(claims)
}

// verifySignature checks sig with the key kid names or, without a kid,
// with each key that fits alg.
func (v *JWTVerifier) verifySignature(algName string, alg jwtAlg, kid string, input, sig []byte) error {
	var digest []byte
	if alg.hash != 0 {
		h := alg.hash.New()
		h.Write(input)
		digest = h.Sum(nil)
	} else {
		digest = input // EdDSA signs the message itself
	}
	var misfit error
	tried := 0
	for i := range v.keys {
		k := &v.keys[i]
		if kid != "" && k.kid != kid {
			continue
		}
		if err := k.fits(algName, alg); err != nil {
			misfit = err
			continue
		}
		tried++
		if k.verify(alg, digest, sig) {
			return nil
		}
	}
	switch {
	case tried > 0:
		return fmt.Errorf("token signature does not verify (alg %s)", algName)
	case kid != "" && misfit == nil:
		return fmt.Errorf("token kid %s names no key of %s", jwtQuote(kid), v.file)
	case kid != "":
		return misfit
	default:
		return fmt.Errorf("token has no kid and no key of %s fits alg %s", v.file, algName)
	}
}

// fits reports why k cannot verify a signature made with alg, or nil.
func (k *jwtKey) fits(algName string, alg jwtAlg) error {
	if k.use != "" && k.use != "sig" {
		return fmt.Errorf("key %q is for use %q, not signatures", k.kid, k.use)
	}
	// A key bound to one alg must not be used with another (RFC 7517 §4.4).
	if k.alg != "" && k.alg != algName {
		return fmt.Errorf("key %q is for alg %s, not the token's %s", k.kid, k.alg, algName)
	}
	switch pub := k.pub.(type) {
	case *rsa.PublicKey:
		if alg.kind == "RS" || alg.kind == "PS" {
			return nil
		}
		return fmt.Errorf("key %q is an RSA key, not one for alg %s", k.kid, algName)
	case *ecdsa.PublicKey:
		if alg.kind == "ES" && pub.Curve == alg.curve {
			return nil
		}
		return fmt.Errorf("key %q is an EC %s key, not one for alg %s", k.kid, pub.Curve.Params().Name, algName)
	default:
		if alg.kind == "EdDSA" {
			return nil
		}
		return fmt.Errorf("key %q is an Ed25519 key, not one for alg %s", k.kid, algName)
	}
}

// verify checks sig over digest (the message itself for EdDSA); k fits alg.
func (k *jwtKey) verify(alg jwtAlg, digest, sig []byte) bool {
	switch pub := k.pub.(type) {
	case *rsa.PublicKey:
		if alg.kind == "PS" {
			// RFC 7518 §3.5: the salt is as long as the hash.
			opts := &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash}
			return rsa.VerifyPSS(pub, alg.hash, digest, sig, opts) == nil
		}
		return rsa.VerifyPKCS1v15(pub, alg.hash, digest, sig) == nil
	case *ecdsa.PublicKey:
		// RFC 7518 §3.4: r and s, each padded to the curve's size, not ASN.1.
		size := (pub.Curve.Params().BitSize + 7) / 8
		if len(sig) != 2*size {
			return false
		}
		r := new(big.Int).SetBytes(sig[:size])
		s := new(big.Int).SetBytes(sig[size:])
		return ecdsa.Verify(pub, digest, r, s)
	case ed25519.PublicKey:
		return ed25519.Verify(pub, digest, sig)
	}
	return false
}

// checkClaims checks exp, nbf, iat, iss and aud.
func (v *JWTVerifier) checkClaims(claims jwtObject, now time.Time) error {
	exp, ok, err := jwtTime(claims, "exp")
	if err != nil {
		return err
	}
	// A token without exp would be good forever once leaked.
	if !ok {
		return errors.New("token has no exp claim")
	}
	if !now.Before(exp.Add(v.leeway)) {
		return fmt.Errorf("token expired at %s", exp.UTC().Format(time.RFC3339))
	}
	nbf, ok, err := jwtTime(claims, "nbf")
	if err != nil {
		return err
	}
	if ok && now.Add(v.leeway).Before(nbf) {
		return fmt.Errorf("token not valid before %s", nbf.UTC().Format(time.RFC3339))
	}
	iat, ok, err := jwtTime(claims, "iat")
	if err != nil {
		return err
	}
	if ok && iat.After(now.Add(v.leeway)) {
		return fmt.Errorf("token issued in the future, at %s", iat.UTC().Format(time.RFC3339))
	}
	if v.issuer != "" {
		var iss string
		if _, err := claims.get("iss", &iss); err != nil {
			return err
		}
		if iss != v.issuer {
			return fmt.Errorf("token issuer %q is not %q", iss, v.issuer)
		}
	}
	// aud is a string or an array of strings (RFC 7519 §4.1.3).
	var aud []string
	if raw, ok := claims["aud"]; ok && len(raw) > 0 && raw[0] == '"' {
		var one string
		if err := json.Unmarshal(raw, &one); err != nil {
			return fmt.Errorf("claim \"aud\": %v", err)
		}
		aud = []string{one}
	} else if _, err := claims.get("aud", &aud); err != nil {
		return err
	}
	if len(aud) == 0 {
		return errors.New("token has no aud claim")
	}
	for _, a := range aud {
		if slices.Contains(v.audiences, a) {
			return nil
		}
	}
	return fmt.Errorf("token audience %q is not one of %q", aud, v.audiences)
}

// jwtTime reads a NumericDate claim: seconds since the epoch, perhaps
// with a fraction.
func jwtTime(claims jwtObject, name string) (time.Time, bool, error) {
	var f float64
	ok, err := claims.get(name, &f)
	if !ok || err != nil {
		return time.Time{}, ok, err
	}
	// Beyond ±1e12 s (~31,000 years) the conversion to int64 nanoseconds
	// would overflow; no real token goes there.
	if math.Abs(f) > 1e12 {
		return time.Time{}, true, fmt.Errorf("claim %q out of range", name)
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)), true, nil
}

// jwtPrincipal names who the verified claims are about.
func jwtPrincipal(claims jwtObject) (string, error) {
	var email, sub string
	if _, err := claims.get("email", &email); err != nil {
		return "", err
	}
	if email != "" {
		// Some providers send email_verified as a string.
		var verified any
		ok, err := claims.get("email_verified", &verified)
		if err != nil {
			return "", err
		}
		// An unverified address may belong to someone else: refuse rather
		// than fall back to sub, which names the same unverified account.
		if ok && verified != true && verified != "true" {
			return "", fmt.Errorf("token email %q is not verified", email)
		}
		if strings.HasSuffix(email, ".gserviceaccount.com") {
			return "serviceAccount:" + email, nil
		}
		return "user:" + email, nil
	}
	if _, err := claims.get("sub", &sub); err != nil {
		return "", err
	}
	if sub == "" {
		return "", errors.New("token names no principal: no email or sub claim")
	}
	return "serviceAccount:" + sub, nil
}
