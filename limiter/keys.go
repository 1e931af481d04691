package limiter

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// DefaultKeyPrefix starts every key unless configured otherwise.
const DefaultKeyPrefix = "ratelimit:"

// MaxPlainPart is the longest identity or region kept as it is in a key;
// longer values are replaced by their hash.
const MaxPlainPart = 64

// hashedLen is the length of a hashed part: "=" and 32 hex digits (128 bits
// of SHA-256).
const hashedLen = 1 + 32

// emptyPart stands for an identity or region that expanded to nothing. It
// cannot be confused with a hashed part (those are longer) or a plain part
// (those never start with "=").
const emptyPart = "="

// KeyBuilder builds the store keys of one limiter:
//
//	<prefix><name>:<algorithm>:{<identity>}            bucket without region
//	<prefix><name>:<algorithm>:{<identity>}:<region>   bucket of one region
//	<prefix><name>:<algorithm>:{<identity>}:*          global ceiling
//
// The identity sits in a Redis Cluster hash tag, so all keys of one identity
// share a slot. Identity and region come from clients, so each is kept as it
// is only when it is 1 to 64 printable ASCII bytes without '{', '}', ':', '*'
// or a leading '='; anything else (empty, long, control bytes, invalid
// UTF-8, braces) becomes "=" and a 32-hex-digit hash of itself. No input can
// break the hash tag, reach another limiter's keys or grow a key past
// len(prefix)+len(name)+~120 bytes.
type KeyBuilder struct {
	prefix string // "<prefix><name>:<algorithm>:{"
}

// NewKeyBuilder checks prefix and name and returns a builder.
func NewKeyBuilder(prefix, name string, alg Algorithm) (KeyBuilder, error) {
	if strings.ContainsAny(prefix, "{}") {
		return KeyBuilder{}, fmt.Errorf("key prefix %q must not contain '{' or '}' (they would break the Redis Cluster hash tag)", prefix)
	}
	if err := ValidName(name); err != nil {
		return KeyBuilder{}, err
	}
	return KeyBuilder{prefix: prefix + name + ":" + alg.String() + ":{"}, nil
}

// ValidName checks a limiter name: 1 to 64 of [A-Za-z0-9_.-].
func ValidName(name string) error {
	if name == "" || len(name) > 64 {
		return errors.New("limiter name must be 1 to 64 characters")
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("limiter name %q may hold only letters, digits, '_', '-' and '.'", name)
		}
	}
	return nil
}

// Bucket returns the key of identity's bucket; region is used when
// withRegion is true (a region that expanded to nothing is its own bucket).
func (kb KeyBuilder) Bucket(identity string, withRegion bool, region string) string {
	id := safePart(identity)
	n := len(kb.prefix) + len(id) + 1
	var reg string
	if withRegion {
		reg = safePart(region)
		n += 1 + len(reg)
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(kb.prefix)
	b.WriteString(id)
	b.WriteByte('}')
	if withRegion {
		b.WriteByte(':')
		b.WriteString(reg)
	}
	return b.String()
}

// Global returns the key of identity's global ceiling.
func (kb KeyBuilder) Global(identity string) string {
	id := safePart(identity)
	var b strings.Builder
	b.Grow(len(kb.prefix) + len(id) + 3)
	b.WriteString(kb.prefix)
	b.WriteString(id)
	b.WriteString("}:*")
	return b.String()
}

// safePart returns s when it can stand in a key as it is, otherwise its hash.
func safePart(s string) string {
	if s == "" {
		return emptyPart
	}
	if len(s) <= MaxPlainPart && s[0] != '=' {
		plain := true
		for i := 0; i < len(s); i++ {
			c := s[i]
			if c <= ' ' || c > '~' || c == '{' || c == '}' || c == ':' || c == '*' {
				plain = false
				break
			}
		}
		if plain {
			return s
		}
	}
	sum := sha256.Sum256([]byte(s))
	var buf [hashedLen]byte
	buf[0] = '='
	hex.Encode(buf[1:], sum[:16])
	return string(buf[:])
}

// HashTag returns the part of key between the first '{' and the next '}',
// the part Redis Cluster hashes; "" when there is none.
func HashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return ""
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j < 0 {
		return ""
	}
	return key[i+1 : i+1+j]
}
