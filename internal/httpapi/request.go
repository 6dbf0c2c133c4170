package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf16"
)

// decodeJSON decodes one JSON value from body into v, refusing unknown
// fields and anything after the value, with errors that say what was wrong
// in JSON terms rather than Go ones.
func decodeJSON(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
			return errorf(http.StatusBadRequest, "invalid JSON: data after the request object")
		}
		return nil
	}
	var syntaxErr *json.SyntaxError
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return errorf(http.StatusBadRequest, "request body is empty")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errorf(http.StatusBadRequest, "invalid JSON: unexpected end of input")
	case errors.As(err, &syntaxErr):
		return errorf(http.StatusBadRequest, "invalid JSON at byte %d: %s", syntaxErr.Offset, strings.TrimPrefix(syntaxErr.Error(), "json: "))
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			field = "the request"
		}
		return errorf(http.StatusBadRequest, "invalid JSON: %s must be %s, not %s", field, jsonKind(typeErr.Type), typeErr.Value)
	}
	// Unknown fields, among others: "json: unknown field \"x\"".
	return errorf(http.StatusBadRequest, "invalid JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
}

// jsonKind names the JSON kind a Go type is decoded from.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "a value of another type"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Bool:
		return "a boolean"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "a number"
}

// decodeBase64 decodes bytes as proto3's JSON mapping accepts them:
// standard or URL-safe base64, with or without padding.
func decodeBase64(s string) ([]byte, error) {
	s = strings.TrimRight(s, "=")
	if strings.ContainsAny(s, "-_") {
		return base64.RawURLEncoding.DecodeString(s)
	}
	return base64.RawStdEncoding.DecodeString(s)
}

// checkSurrogates refuses a \u escape that is half of a UTF-16 surrogate
// pair without its other half. encoding/json would decode it to U+FFFD, so
// distinct ordering keys ("\ud800", "\udbff") would become one without a
// word; protobuf's JSON parser refuses them too. body is valid JSON, where
// a backslash only occurs in a string.
func checkSurrogates(body []byte) error {
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		i++ // the escaped character
		if i >= len(body) || body[i] != 'u' || i+4 >= len(body) {
			continue
		}
		r, err := strconv.ParseUint(string(body[i+1:i+5]), 16, 16)
		if err != nil || !utf16.IsSurrogate(rune(r)) {
			continue
		}
		start := i - 1
		i += 4
		if r < 0xdc00 && i+6 < len(body) && body[i+1] == '\\' && body[i+2] == 'u' {
			if lo, err := strconv.ParseUint(string(body[i+3:i+7]), 16, 16); err == nil && lo >= 0xdc00 && lo <= 0xdfff {
				i += 6 // a whole pair
				continue
			}
		}
		return errorf(http.StatusBadRequest, "invalid JSON at byte %d: %s is half of a UTF-16 surrogate pair, not a character", start, body[start:i+1])
	}
	return nil
}
