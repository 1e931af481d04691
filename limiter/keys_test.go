package limiter_test

import (
	"strings"
	"testing"

	"github.com/sliding-ratelimit/sliding_ratelimit/limiter"
)

// hostileSeeds are client-controlled values a key must survive.
var hostileSeeds = []string{
	"", "a", "k_live_42", "{", "}", "{evil}", "a}b{c", ":", "us:gb", "*", "=", "=abc",
	"\x00", "a\x00b", "\r\n", "\t", "\xff\xfe", "\xc3\x28", "ключ", "🙂",
	strings.Repeat("x", 64), strings.Repeat("x", 65), strings.Repeat("{", 1<<20),
}

// maxKeyLen bounds every key: prefix, name, algorithm, two parts of at most
// 64 bytes (hashed parts are 33) and the separators.
func maxKeyLen(kb string) int { return len(kb) + limiter.MaxPlainPart*2 + 8 }

// FuzzKeys: every key keeps exactly one hash tag, holding the identity's
// (sanitised) value; keys stay bounded; different identities or regions
// never share a key; the global key is never a bucket key.
func FuzzKeys(f *testing.F) {
	for _, a := range hostileSeeds {
		for _, b := range []string{"", "us", "{", strings.Repeat("é", 40)} {
			f.Add(a, b, b, a)
		}
	}
	kb, err := limiter.NewKeyBuilder("ratelimit:", "api")
	if err != nil {
		f.Fatal(err)
	}
	prefix := "ratelimit:api:log:"
	specs := []limiter.KeySpec{{Segment: "log"}, {Segment: "log", Global: true}}
	f.Fuzz(func(t *testing.T, id1, r1, id2, r2 string) {
		var ks1, ks2 [2]string
		kb.Keys(ks1[:], specs, id1, true, r1)
		kb.Keys(ks2[:], specs, id2, true, r2)
		k1, g1, k2 := ks1[0], ks1[1], ks2[0]
		if k := kb.Key("log", id1, true, r1); k != k1 {
			t.Fatalf("Key %q and Keys %q differ", k, k1)
		}
		if limiter.Tag(id1) != limiter.HashTag(k1) {
			t.Fatalf("Tag(%q) = %q, the key's hash tag is %q", id1, limiter.Tag(id1), limiter.HashTag(k1))
		}
		for _, k := range []string{k1, k2, g1, kb.Key("log", id1, false, "")} {
			if len(k) > maxKeyLen(prefix) {
				t.Fatalf("key of %d bytes: %.80q", len(k), k)
			}
			if !strings.HasPrefix(k, prefix+"{") {
				t.Fatalf("key %q lost its prefix or hash tag", k)
			}
			if strings.Count(k, "{") != 1 || strings.Count(k, "}") != 1 {
				t.Fatalf("key %q must hold exactly one hash tag", k)
			}
			for i := 0; i < len(k); i++ {
				if k[i] <= ' ' || k[i] > '~' {
					t.Fatalf("key %q holds byte %#x", k, k[i])
				}
			}
		}
		if limiter.HashTag(k1) != limiter.HashTag(g1) {
			t.Fatalf("bucket %q and global %q of one identity are on different slots", k1, g1)
		}
		if (id1 != id2 || r1 != r2) && k1 == k2 {
			t.Fatalf("(%q,%q) and (%q,%q) share key %q", id1, r1, id2, r2, k1)
		}
		if id1 != id2 && limiter.HashTag(k1) == limiter.HashTag(k2) {
			t.Fatalf("identities %q and %q share a hash tag", id1, id2)
		}
		if g1 == k2 || ks2[1] == k1 {
			t.Fatalf("a global key equals a bucket key: %q %q", g1, k2)
		}
	})
}
