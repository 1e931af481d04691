package slidingratelimit

import (
	"fmt"
	"sync"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// amountLines remembers where a Caddyfile adapted in this process gave
// each limit, global_limit, cost and max_concurrent that holds a
// placeholder ("Caddyfile:45"), by limiter name, field and value: the
// placeholders the config provides are known only when it loads, past the
// adapter, and an error found then points at the line all the same
// (`caddy validate` and `caddy run` adapt and load in one process). A
// config loaded as JSON has no line to point at.
var amountLines sync.Map

func amountLineKey(name, field string, a Amount) string {
	if name == "" {
		name = DefaultName
	}
	return name + "\x00" + field + "\x00" + string(a)
}

// rememberAmountLines records the lines of h's amounts with placeholders,
// pos being the tokens of the fields, as UnmarshalCaddyfile read them.
func rememberAmountLines(h *Handler, pos map[string]caddyfile.Token) {
	fields := map[string]Amount{"limit": h.Limit, "global_limit": h.GlobalLimit, "cost": h.Cost, "max_concurrent": h.MaxConcurrent}
	for i, l := range h.Limits {
		fields[fmt.Sprintf("limits[%d]", i)] = l.Limit
	}
	for i, l := range h.GlobalLimits {
		fields[fmt.Sprintf("global_limits[%d]", i)] = l.Limit
	}
	for field, a := range fields {
		if tok, ok := pos[field]; ok && a.isDynamic() {
			amountLines.Store(amountLineKey(h.Name, field, a), fmt.Sprintf("%s:%d", tok.File, tok.Line))
		}
	}
}

// amountLine is ", at <file>:<line>" of the field of limiter name holding
// a, when a Caddyfile of this process gave it, and "" otherwise.
func amountLine(name, field string, a Amount) string {
	if at, ok := amountLines.Load(amountLineKey(name, field, a)); ok {
		return ", at " + at.(string)
	}
	return ""
}
