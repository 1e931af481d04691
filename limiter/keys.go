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

// GlobalRegion is the region segment of an identity's global ceiling.
const GlobalRegion = "*"

// KeyBuilder builds the store keys of one limiter:
//
//	<prefix><name>:<segment>:{<identity>}            without region
//	<prefix><name>:<segment>:{<identity>}:<region>   per region
//	<prefix><name>:<segment>:{<identity>}:*          the identity's global ceiling
//
//	<prefix><name>:override:{<identity>}             the identity's overrides
//
// where segment is what the key holds: log, counter, fixed, token (the
// algorithm's state), calendar (calendar periods), ban, lease. The identity
// sits in a Redis Cluster hash tag, so every key of one identity shares a
// slot and one script call may touch them all. Identity and region come
// from clients, so each is kept as it is only when it is 1 to 64 printable
// ASCII bytes without '{', '}', ':', '*' or a leading '='; anything else
// (empty, long, control bytes, invalid UTF-8, braces) becomes "=" and a
// 32-hex-digit hash of itself. No input can break the hash tag, reach
// another limiter's keys or grow a key past len(prefix)+len(name)+~120 bytes.
type KeyBuilder struct {
	ns string // "<prefix><name>:"
}

// NewKeyBuilder checks prefix and name and returns a builder.
func NewKeyBuilder(prefix, name string) (KeyBuilder, error) {
	if strings.ContainsAny(prefix, "{}") {
		return KeyBuilder{}, fmt.Errorf("key prefix %q must not contain '{' or '}' (they would break the Redis Cluster hash tag)", prefix)
	}
	if err := ValidName(name); err != nil {
		return KeyBuilder{}, err
	}
	return KeyBuilder{ns: prefix + name + ":"}, nil
}

// Namespace is what every key of the limiter starts with.
func (kb KeyBuilder) Namespace() string { return kb.ns }

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

// KeySpec is one key of a request: what it holds, and whether it is the
// identity's global ceiling, or the identity's own (in no region), else the
// request's bucket: identity, and region when the limiter has regions.
type KeySpec struct {
	Segment  string
	Global   bool
	Identity bool
}

// Key returns one key of identity (in region, when withRegion).
func (kb KeyBuilder) Key(segment, identity string, withRegion bool, region string) string {
	var dst [1]string
	kb.Keys(dst[:], []KeySpec{{Segment: segment}}, identity, withRegion, region)
	return dst[0]
}

// Global returns the key of identity's global ceiling.
func (kb KeyBuilder) Global(segment, identity string) string {
	var dst [1]string
	kb.Keys(dst[:], []KeySpec{{Segment: segment, Global: true}}, identity, false, "")
	return dst[0]
}

// Keys fills dst[i] with the key of specs[i] for identity and region, all
// from one allocation (the keys are substrings of one string).
func (kb KeyBuilder) Keys(dst []string, specs []KeySpec, identity string, withRegion bool, region string) {
	id := safePart(identity)
	reg := ""
	if withRegion {
		reg = safePart(region)
	}
	n := 0
	for _, s := range specs {
		n += len(kb.ns) + len(s.Segment) + 3 + len(id)
		if s.Global {
			n += 1 + len(GlobalRegion)
		} else if withRegion && !s.Identity {
			n += 1 + len(reg)
		}
	}
	var b strings.Builder
	b.Grow(n)
	var endBuf [8]int
	ends := endBuf[:0]
	if len(specs) > len(endBuf) {
		ends = make([]int, 0, len(specs))
	}
	for _, s := range specs {
		b.WriteString(kb.ns)
		b.WriteString(s.Segment)
		b.WriteString(":{")
		b.WriteString(id)
		b.WriteByte('}')
		if s.Global {
			b.WriteByte(':')
			b.WriteString(GlobalRegion)
		} else if withRegion && !s.Identity {
			b.WriteByte(':')
			b.WriteString(reg)
		}
		ends = append(ends, b.Len())
	}
	all := b.String()
	from := 0
	for i := range specs {
		dst[i] = all[from:ends[i]]
		from = ends[i]
	}
}

// Tag is the hash tag of identity's keys: what DenyCache.Forget takes.
func Tag(identity string) string { return safePart(identity) }

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
