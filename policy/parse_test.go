package policy

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// specExample is the first example block of docs/rules.md, verbatim.
const specExample = `# name     methods  path                  identity       limit   options
login:     POST     /api/login            by ip          5/15m
register:  POST     /api/register         by ip          3/1h
reset:     POST     /api/password-reset   by email       3/1h    sliding
reset-ip:  POST     /api/password-reset   by ip          5/1m
send:      *        /api/send-email       by tenant      100/1h
query:     GET,POST /api/query            by tenant      1000/1d
global:    *        /api/*                by global      1000/1m sliding fail=closed
`

// parseErrorCase is rules whose parse fails with the error message want.
type parseErrorCase struct {
	name string
	src  string
	want string // the whole error message
}

func TestParseErrors(t *testing.T) {
	tests := []parseErrorCase{
		// Shape.
		{"no name", "POST /api/login by ip 5/15m",
			`line 1: name: expected "name:" at the start of the rule, got "POST"`},
		{"bad name upper case", "Login: POST /api/login by ip 5/15m",
			`line 1: name: expected [a-z0-9-]+, got "Login"`},
		{"bad name underscore", "log_in: POST /api/login by ip 5/15m",
			`line 1: name: expected [a-z0-9-]+, got "log_in"`},
		{"empty name", ": POST /api/login by ip 5/15m",
			`line 1: name: expected [a-z0-9-]+, got ""`},
		{"duplicate name", "login: POST /api/login by ip 5/15m\n\nlogin: POST /api/login2 by ip 5/15m",
			`line 3: rule "login": name: expected a unique name, got a duplicate of line 1`},
		{"duplicate name on one line", "a: * /a by ip 1/1s; a: * /b by ip 1/1s",
			`line 1, column 21: rule "a": name: expected a unique name, got a duplicate of line 1, column 1`},
		{"each rule of a line at its own column", "a: * /a by ip 1/1s;  b: * /b by ip 1/1x ;c: GETT /c by ip 1/1s;;",
			strings.Join([]string{
				`line 1, column 22: rule "b": limit: expected N/window such as 5/15m, got "1/1x"`,
				`line 1, column 42: rule "c": methods: expected a method of the IANA HTTP Method Registry (such as GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS) or PURGE, got "GETT"`,
			}, "\n")},
		{"missing by", "login: POST /api/login ip 5/15m",
			`line 1: rule "login": syntax: expected "by" before the identity, got "POST /api/login ip 5/15m"`},
		{"name only", "login:",
			`line 1: rule "login": syntax: expected "by" before the identity, got ""`},
		{"too few fields before by", "login: /api/login by ip 5/15m",
			`line 1: rule "login": syntax: expected methods and path before "by", got "/api/login"`},
		{"too many fields before by", "login: GET POST /api/login by ip 5/15m",
			`line 1: rule "login": syntax: expected methods and path before "by", got "GET POST /api/login"`},
		{"too few fields after by", "login: POST /api/login by ip",
			`line 1: rule "login": syntax: expected identity and limit after "by", got "ip"`},
		{"nothing after by", "login: POST /api/login by",
			`line 1: rule "login": syntax: expected identity and limit after "by", got ""`},

		// Methods.
		{"empty method list", "login: , /api/login by ip 5/15m",
			`line 1: rule "login": methods: expected * or a comma-separated list such as GET,POST, got ","`},
		{"empty method in list", "login: GET,,POST /api/login by ip 5/15m",
			`line 1: rule "login": methods: expected * or a comma-separated list such as GET,POST, got "GET,,POST"`},
		{"star in list", "login: GET,* /api/login by ip 5/15m",
			`line 1: rule "login": methods: expected * or a comma-separated list such as GET,POST, got "GET,*"`},
		{"bad method", "login: GE/T /api/login by ip 5/15m",
			`line 1: rule "login": methods: expected a method name (an RFC 9110 token), got "GE/T"`},
		{"bad method in list", "login: GET,P(OST /api/login by ip 5/15m",
			`line 1: rule "login": methods: expected a method name (an RFC 9110 token), got "P(OST"`},
		{"duplicate method", "login: GET,get /api/login by ip 5/15m",
			`line 1: rule "login": methods: expected each method once, got "GET" twice`},
		{"unknown method", "login: GETT /api/login by ip 5/15m",
			`line 1: rule "login": methods: expected a method of the IANA HTTP Method Registry (such as GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS) or PURGE, got "GETT"`},
		{"unknown method in a list, any case", "login: get,Postt /api/login by ip 5/15m",
			`line 1: rule "login": methods: expected a method of the IANA HTTP Method Registry (such as GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS) or PURGE, got "POSTT"`},

		// Path.
		{"relative path", "login: POST api/login by ip 5/15m",
			`line 1: rule "login": path: expected an absolute path such as /api/login or a prefix such as /api/*, got "api/login"`},
		{"star in the middle", "login: POST /api/*/login by ip 5/15m",
			`line 1: rule "login": path: expected "*" only in a final "/*", got "/api/*/login"`},
		{"star without slash", "login: POST /api* by ip 5/15m",
			`line 1: rule "login": path: expected "*" only in a final "/*", got "/api*"`},
		{"star alone", "login: POST * by ip 5/15m",
			`line 1: rule "login": path: expected an absolute path such as /api/login or a prefix such as /api/*, got "*"`},
		{"encoded star", "login: POST /api/%2a by ip 5/15m",
			`line 1: rule "login": path: expected "*" only in a final "/*", got "/api/%2a"`},
		{"query", "login: POST /api/login?x=1 by ip 5/15m",
			`line 1: rule "login": path: expected a path without a query, got "/api/login?x=1"`},
		{"malformed escape", "login: POST /api/%zz by ip 5/15m",
			`line 1: rule "login": path: expected a valid path, got "/api/%zz": malformed percent-escape at byte 5`},
		{"encoded NUL", "login: POST /api/%00 by ip 5/15m",
			`line 1: rule "login": path: expected a valid path, got "/api/%00": encoded control character at byte 5`},
		{"doubly encoded NUL", "login: POST /api/%2500 by ip 5/15m",
			`line 1: rule "login": path: expected a path without control characters, got "/api/%2500"`},

		// Identity.
		{"unknown identity", "login: POST /api/login by user 5/15m",
			`line 1: rule "login": identity: expected ip, email, email(field), tenant, tenant(Header-Name), header(Name), jwt, jwt(claim) or global, got "user"`},
		{"identity case", "login: POST /api/login by IP 5/15m",
			`line 1: rule "login": identity: expected ip, email, email(field), tenant, tenant(Header-Name), header(Name), jwt, jwt(claim) or global, got "IP"`},
		{"unclosed argument", "login: POST /api/login by email(user 5/15m",
			`line 1: rule "login": identity: expected ip, email, email(field), tenant, tenant(Header-Name), header(Name), jwt, jwt(claim) or global, got "email(user"`},
		{"ip with argument", "login: POST /api/login by ip(64) 5/15m",
			`line 1: rule "login": identity: expected ip without an argument, got "ip(64)"`},
		{"global with argument", "login: POST /api/login by global() 5/15m",
			`line 1: rule "login": identity: expected global without an argument, got "global()"`},
		{"bad email field", "login: POST /api/login by email(user:name) 5/15m",
			`line 1: rule "login": identity: expected email(field) with a field of [A-Za-z0-9_.-]+, got "email(user:name)"`},
		{"empty email field", "login: POST /api/login by email() 5/15m",
			`line 1: rule "login": identity: expected email(field) with a field of [A-Za-z0-9_.-]+, got "email()"`},
		{"bad tenant header", "login: POST /api/login by tenant(X:Org) 5/15m",
			`line 1: rule "login": identity: expected tenant(Header-Name) with an RFC 9110 token as the header name, got "tenant(X:Org)"`},
		{"empty tenant header", "login: POST /api/login by tenant() 5/15m",
			`line 1: rule "login": identity: expected tenant(Header-Name) with an RFC 9110 token as the header name, got "tenant()"`},
		{"header without name", "login: POST /api/login by header 5/15m",
			`line 1: rule "login": identity: expected header(Name) with an RFC 9110 token as the header name, got "header"`},
		{"bad header name", "login: POST /api/login by header(X/Key) 5/15m",
			`line 1: rule "login": identity: expected header(Name) with an RFC 9110 token as the header name, got "header(X/Key)"`},
		{"empty jwt claim", "api: GET /api by jwt() 5/15m",
			`line 1: rule "api": identity: expected jwt(claim) with a claim name or dotted path of [A-Za-z0-9_:/-] segments, got "jwt()"`},
		{"jwt claim with an empty segment", "api: GET /api by jwt(app_metadata..tenant) 5/15m",
			`line 1: rule "api": identity: expected jwt(claim) with a claim name or dotted path of [A-Za-z0-9_:/-] segments, got "jwt(app_metadata..tenant)"`},
		{"jwt claim with a leading dot", "api: GET /api by jwt(.tenant) 5/15m",
			`line 1: rule "api": identity: expected jwt(claim) with a claim name or dotted path of [A-Za-z0-9_:/-] segments, got "jwt(.tenant)"`},
		{"jwt claim with a trailing dot", "api: GET /api by jwt(tenant.) 5/15m",
			`line 1: rule "api": identity: expected jwt(claim) with a claim name or dotted path of [A-Za-z0-9_:/-] segments, got "jwt(tenant.)"`},
		{"jwt claim with a bad character", "api: GET /api by jwt(ten*ant) 5/15m",
			`line 1: rule "api": identity: expected jwt(claim) with a claim name or dotted path of [A-Za-z0-9_:/-] segments, got "jwt(ten*ant)"`},
		{"jwt claim not closed", "api: GET /api by jwt(sub 5/15m",
			`line 1: rule "api": identity: expected ip, email, email(field), tenant, tenant(Header-Name), header(Name), jwt, jwt(claim) or global, got "jwt(sub"`},

		// Limit (and see the limits that are not N/window below).
		{"zero limit", "login: POST /api/login by ip 0/15m",
			`line 1: rule "login": limit: expected a count from 1 to 1000000000000, got "0/15m"`},
		{"limit overflow", "login: POST /api/login by ip 99999999999999999999/15m",
			`line 1: rule "login": limit: expected a count from 1 to 1000000000000, got "99999999999999999999/15m"`},
		{"zero window", "login: POST /api/login by ip 5/0m",
			`line 1: rule "login": limit: expected a window from 1s to 3650d, got "5/0m"`},
		{"window too long", "login: POST /api/login by ip 5/3651d",
			`line 1: rule "login": limit: expected a window from 1s to 3650d, got "5/3651d"`},
		{"window overflow", "login: POST /api/login by ip 5/9999999999999999999999h",
			`line 1: rule "login": limit: expected a window from 1s to 3650d, got "5/9999999999999999999999h"`},

		// Options.
		{"unknown option", "login: POST /api/login by ip 5/15m slow",
			`line 1: rule "login": options: expected fixed, sliding, sliding(bucket), reset, token, burst=N, fail=open|closed|local, shadow, cost=N, count=all, tz=Area/City, anchor=D, charge=header(Name)|json(path) or plans(claim)=name:N/window,..., got "slow"`},
		{"option with a value it does not take", "login: POST /api/login by ip 5/15m shadow=true",
			`line 1: rule "login": options: expected fixed, sliding, sliding(bucket), reset, token, burst=N, fail=open|closed|local, shadow, cost=N, count=all, tz=Area/City, anchor=D, charge=header(Name)|json(path) or plans(claim)=name:N/window,..., got "shadow=true"`},
		{"extra limit", "login: POST /api/login by ip 5/15m 10/1h",
			`line 1: rule "login": options: expected fixed, sliding, sliding(bucket), reset, token, burst=N, fail=open|closed|local, shadow, cost=N, count=all, tz=Area/City, anchor=D, charge=header(Name)|json(path) or plans(claim)=name:N/window,..., got "10/1h"`},
		{"duplicate option", "login: POST /api/login by ip 5/15m shadow shadow",
			`line 1: rule "login": options: expected each option once, got "shadow" twice`},
		{"duplicate valued option", "login: POST /api/login by ip 5/15m cost=1 cost=2",
			`line 1: rule "login": options: expected each option once, got "cost" twice`},
		{"duplicate algorithm", "login: POST /api/login by ip 5/15m sliding sliding(1m)",
			`line 1: rule "login": options: expected each option once, got "sliding" twice`},
		{"two algorithms", "login: POST /api/login by ip 5/15m fixed token",
			`line 1: rule "login": options: expected at most one algorithm, got "fixed" and "token"`},
		{"two algorithms with burst", "login: POST /api/login by ip 5/15m sliding(1m) burst=3 reset",
			`line 1: rule "login": options: expected at most one algorithm, got "sliding(1m)" and "reset"`},
		{"burst without token", "login: POST /api/login by ip 5/15m burst=10",
			`line 1: rule "login": burst: expected only with token, got algorithm "fixed"`},
		{"burst with sliding", "login: POST /api/login by ip 5/15m burst=10 sliding",
			`line 1: rule "login": burst: expected only with token, got algorithm "sliding"`},
		{"zero burst", "login: POST /api/login by ip 5/15m token burst=0",
			`line 1: rule "login": burst: expected burst=N with N from 1 to 1000000000000, got "burst=0"`},
		{"burst without value", "login: POST /api/login by ip 5/15m token burst",
			`line 1: rule "login": burst: expected burst=N with N from 1 to 1000000000000, got "burst"`},
		{"bad burst", "login: POST /api/login by ip 5/15m token burst=ten",
			`line 1: rule "login": burst: expected burst=N with N from 1 to 1000000000000, got "burst=ten"`},
		{"burst refills too slowly", "login: POST /api/login by ip 1/1000d token burst=4",
			`line 1: rule "login": burst: expected at most 3 so that a full burst refills within 3650d, got "burst=4"`},
		{"zero cost", "login: POST /api/login by ip 5/15m cost=0",
			`line 1: rule "login": cost: expected cost=N with N from 1 to 1000000000000, got "cost=0"`},
		{"negative cost", "login: POST /api/login by ip 5/15m cost=-1",
			`line 1: rule "login": cost: expected cost=N with N from 1 to 1000000000000, got "cost=-1"`},
		{"cost above limit", "login: POST /api/login by ip 5/15m cost=6",
			`line 1: rule "login": cost: expected at most the limit 5, got "cost=6"`},
		{"cost above sliding limit", "login: POST /api/login by ip 5/15m sliding cost=6",
			`line 1: rule "login": cost: expected at most the limit 5, got "cost=6"`},
		{"cost above default burst", "login: POST /api/login by ip 5/15m token cost=6",
			`line 1: rule "login": cost: expected at most the burst 5, got "cost=6"`},
		{"cost above burst", "login: POST /api/login by ip 50/15m cost=11 token burst=10",
			`line 1: rule "login": cost: expected at most the burst 10, got "cost=11"`},
		{"bad fail mode", "login: POST /api/login by ip 5/15m fail=maybe",
			`line 1: rule "login": fail: expected fail=open, fail=closed or fail=local, got "fail=maybe"`},
		{"fail without value", "login: POST /api/login by ip 5/15m fail",
			`line 1: rule "login": fail: expected fail=open, fail=closed or fail=local, got "fail"`},
		{"bad count", "login: POST /api/login by ip 5/15m count=denied",
			`line 1: rule "login": count: expected count=all, got "count=denied"`},
		{"bad sliding syntax", "login: POST /api/login by ip 5/15m sliding(10)",
			`line 1: rule "login": sliding: expected sliding(bucket) such as sliding(10s), got "sliding(10)"`},
		{"empty sliding bucket", "login: POST /api/login by ip 5/15m sliding()",
			`line 1: rule "login": sliding: expected sliding(bucket) such as sliding(10s), got "sliding()"`},
		{"unclosed sliding bucket", "login: POST /api/login by ip 5/15m sliding(10s",
			`line 1: rule "login": sliding: expected sliding(bucket) such as sliding(10s), got "sliding(10s"`},
		{"sliding bucket below 1s", "login: POST /api/login by ip 5/15m sliding(0s)",
			`line 1: rule "login": sliding: expected a bucket of at least 1s, got "sliding(0s)"`},
		{"sliding bucket above window", "login: POST /api/login by ip 5/15m sliding(16m)",
			`line 1: rule "login": sliding: expected a bucket no longer than the window 15m, got "sliding(16m)"`},
		{"sliding bucket overflow", "login: POST /api/login by ip 5/15m sliding(99999999999d)",
			`line 1: rule "login": sliding: expected a bucket no longer than the window 15m, got "sliding(99999999999d)"`},
		{"sliding bucket not dividing", "login: POST /api/login by ip 5/15m sliding(7s)",
			`line 1: rule "login": sliding: expected a bucket that divides the window 15m, got "sliding(7s)"`},

		// Plans.
		{"plans without a claim", "api: GET /api by jwt 5/1m plans=pro:10/1m",
			`line 1: rule "api": plans: expected plans(claim)=name:N/window,... such as plans(tier)=pro:10000/1d, got "plans=pro:10/1m"`},
		{"plans alone", "api: GET /api by jwt 5/1m plans",
			`line 1: rule "api": plans: expected plans(claim)=name:N/window,... such as plans(tier)=pro:10000/1d, got "plans"`},
		{"plans without a list", "api: GET /api by jwt 5/1m plans(tier)=",
			`line 1: rule "api": plans: expected plans(claim)=name:N/window,... such as plans(tier)=pro:10000/1d, got "plans(tier)="`},
		{"plans without =", "api: GET /api by jwt 5/1m plans(tier)",
			`line 1: rule "api": plans: expected plans(claim)=name:N/window,... such as plans(tier)=pro:10000/1d, got "plans(tier)"`},
		{"plans cut short by a comment", "api: GET /api by jwt 5/1m plans(ti#er)=pro:10/1m",
			`line 1: rule "api": plans: expected plans(claim)=name:N/window,... such as plans(tier)=pro:10000/1d, got "plans(ti"`},
		{"plans with a bad claim", "api: GET /api by jwt 5/1m plans(ti*er)=pro:10/1m",
			`line 1: rule "api": plans: expected plans(claim) with a claim name or dotted path of [A-Za-z0-9_:/-] segments, got "plans(ti*er)=pro:10/1m"`},
		{"plans with an empty claim", "api: GET /api by jwt 5/1m plans()=pro:10/1m",
			`line 1: rule "api": plans: expected plans(claim) with a claim name or dotted path of [A-Za-z0-9_:/-] segments, got "plans()=pro:10/1m"`},
		{"plans with a claim with an empty segment", "api: GET /api by jwt 5/1m plans(app..plan)=pro:10/1m",
			`line 1: rule "api": plans: expected plans(claim) with a claim name or dotted path of [A-Za-z0-9_:/-] segments, got "plans(app..plan)=pro:10/1m"`},
		{"plan without a limit", "api: GET /api by jwt 5/1m plans(tier)=pro",
			`line 1: rule "api": plans: expected name:N/window such as pro:10000/1d, got "pro"`},
		{"plan with a bad limit", "api: GET /api by jwt 5/1m plans(tier)=pro:10/1x",
			`line 1: rule "api": plans: expected name:N/window such as pro:10000/1d, got "pro:10/1x"`},
		{"plan without a window", "api: GET /api by jwt 5/1m plans(tier)=pro:10",
			`line 1: rule "api": plans: expected name:N/window such as pro:10000/1d, got "pro:10"`},
		{"empty plan in the list", "api: GET /api by jwt 5/1m plans(tier)=pro:10/1m,",
			`line 1: rule "api": plans: expected name:N/window such as pro:10000/1d, got ""`},
		{"plan without a name", "api: GET /api by jwt 5/1m plans(tier)=:10/1m",
			`line 1: rule "api": plans: expected a plan name of [A-Za-z0-9_.-]+, got ":10/1m"`},
		{"plan with a bad name", "api: GET /api by jwt 5/1m plans(tier)=p*o:10/1m",
			`line 1: rule "api": plans: expected a plan name of [A-Za-z0-9_.-]+, got "p*o:10/1m"`},
		{"plan with a zero count", "api: GET /api by jwt 5/1m plans(tier)=pro:0/1m",
			`line 1: rule "api": plans: expected a count from 1 to 1000000000000, got "pro:0/1m"`},
		{"plan with a zero window", "api: GET /api by jwt 5/1m plans(tier)=pro:10/0m",
			`line 1: rule "api": plans: expected a window from 1s to 3650d, got "pro:10/0m"`},
		{"plan with both out of range", "api: GET /api by jwt 5/1m plans(tier)=pro:0/3651d",
			strings.Join([]string{
				`line 1: rule "api": plans: expected a count from 1 to 1000000000000, got "pro:0/3651d"`,
				`line 1: rule "api": plans: expected a window from 1s to 3650d, got "pro:0/3651d"`,
			}, "\n")},
		{"plan given twice", "api: GET /api by jwt 5/1m plans(tier)=pro:10/1m,team:20/1m,pro:30/1m",
			`line 1: rule "api": plans: expected each plan once, got "pro" twice`},
		{"plans option twice", "api: GET /api by jwt 5/1m plans(tier)=pro:10/1m plans(plan)=team:20/1m",
			`line 1: rule "api": options: expected each option once, got "plans" twice`},
		{"plan below the cost", "api: GET /api by jwt 5/1m cost=3 plans(tier)=free:2/1m,pro:10/1m",
			`line 1: rule "api": plans: expected a limit of at least the cost 3, got "free:2/1m"`},
		{"plan below the cost of a token rule", "api: GET /api by jwt 5/1m token cost=3 plans(tier)=free:2/1m",
			`line 1: rule "api": plans: expected a limit of at least the cost 3, got "free:2/1m"`},
		{"plan too slow for the burst", "api: GET /api by jwt 5/1m token burst=10 plans(tier)=slow:1/1000d",
			`line 1: rule "api": plans: expected a plan under which the burst 10 refills within 3650d, got "slow:1/1000d"`},
		{"every plan problem at once", "api: GET /api by jwt 5/1m plans(a..b)=x,:1/1s,p:0/1s,p:1/1s,p:2/2s",
			strings.Join([]string{
				`line 1: rule "api": plans: expected plans(claim) with a claim name or dotted path of [A-Za-z0-9_:/-] segments, got "plans(a..b)=x,:1/1s,p:0/1s,p:1/1s,p:2/2s"`,
				`line 1: rule "api": plans: expected name:N/window such as pro:10000/1d, got "x"`,
				`line 1: rule "api": plans: expected a plan name of [A-Za-z0-9_.-]+, got ":1/1s"`,
				`line 1: rule "api": plans: expected a count from 1 to 1000000000000, got "p:0/1s"`,
				`line 1: rule "api": plans: expected each plan once, got "p" twice`,
			}, "\n")},

		// Several problems, in source order, each with its line.
		{"several problems",
			"# rules\nlogin: POST /api/login by ip 5/15x\n\nok: GET /a by ip 1/1s\nBad: GET /b by ip 1/1s; x: GET /c by foo 0/1m cost=2 shadow shadow\nlogin: * /* by global 1/1s # again",
			strings.Join([]string{
				`line 2: rule "login": limit: expected N/window such as 5/15m, got "5/15x"`,
				`line 5, column 1: name: expected [a-z0-9-]+, got "Bad"`,
				`line 5, column 25: rule "x": identity: expected ip, email, email(field), tenant, tenant(Header-Name), header(Name), jwt, jwt(claim) or global, got "foo"`,
				`line 5, column 25: rule "x": limit: expected a count from 1 to 1000000000000, got "0/1m"`,
				`line 5, column 25: rule "x": options: expected each option once, got "shadow" twice`,
				`line 6: rule "login": name: expected a unique name, got a duplicate of line 2`,
			}, "\n")},
		{"problems in several fields of one rule", "r: GET,GET api by ip(1) 5/0s sliding(7s) fail=no",
			strings.Join([]string{
				`line 1: rule "r": methods: expected each method once, got "GET" twice`,
				`line 1: rule "r": path: expected an absolute path such as /api/login or a prefix such as /api/*, got "api"`,
				`line 1: rule "r": identity: expected ip without an argument, got "ip(1)"`,
				`line 1: rule "r": limit: expected a window from 1s to 3650d, got "5/0s"`,
				`line 1: rule "r": fail: expected fail=open, fail=closed or fail=local, got "fail=no"`,
			}, "\n")},
	}
	// Limits that are not N/window: a bad unit, no unit, no count of
	// windows, no slash, a negative limit or window, a fraction.
	for _, limit := range []string{"5/15x", "5/15", "5/m", "5", "-5/15m", "5/-15m", "5/1.5m"} {
		tests = append(tests, parseErrorCase{"limit " + limit, "login: POST /api/login by ip " + limit,
			`line 1: rule "login": limit: expected N/window such as 5/15m, got "` + limit + `"`})
	}
	expectParseErrors(t, tests)
}

// expectParseErrors checks that each case's rules fail to parse with
// exactly its message, each problem a *ParseError.
func expectParseErrors(t *testing.T, tests []parseErrorCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse(tt.src)
			if err == nil {
				t.Fatalf("Parse(%q) = %v, want error %q", tt.src, p.Rules(), tt.want)
			}
			if p != nil {
				t.Errorf("Parse(%q) returned a policy with its error", tt.src)
			}
			if got := err.Error(); got != tt.want {
				t.Errorf("Parse(%q) error\n got: %s\nwant: %s", tt.src, got, tt.want)
			}
			// Every problem is a *ParseError that callers can inspect.
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T does not unwrap to *ParseError", err)
			}
			joined, ok := err.(interface{ Unwrap() []error })
			if !ok {
				t.Fatalf("error %T does not unwrap to a list", err)
			}
			var msgs []string
			for _, e := range joined.Unwrap() {
				if _, ok := e.(*ParseError); !ok {
					t.Errorf("problem %T is not a *ParseError", e)
				}
				msgs = append(msgs, e.Error())
			}
			if got := strings.Join(msgs, "\n"); got != tt.want {
				t.Errorf("unwrapped problems\n got: %s\nwant: %s", got, tt.want)
			}
		})
	}
}

func TestParseErrorFields(t *testing.T) {
	_, err := Parse("ok: GET /a by ip 1/1s\n\n  login: POST /api/login by ip 5/15x  ")
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("Parse error %v is not a *ParseError", err)
	}
	want := ParseError{Line: 3, Rule: "login", Msg: `limit: expected N/window such as 5/15m, got "5/15x"`}
	if *pe != want {
		t.Errorf("ParseError = %+v, want %+v", *pe, want)
	}
	if got := (&ParseError{Line: 7, Msg: "x: y"}).Error(); got != "line 7: x: y" {
		t.Errorf("ParseError without a rule: %q", got)
	}
	_, err = Parse("ok: GET /a by ip 1/1s; login: POST /api/login by ip 5/15x")
	if !errors.As(err, &pe) {
		t.Fatalf("Parse error %v is not a *ParseError", err)
	}
	want = ParseError{Line: 1, Column: 24, Rule: "login", Msg: `limit: expected N/window such as 5/15m, got "5/15x"`}
	if *pe != want {
		t.Errorf("ParseError = %+v, want %+v", *pe, want)
	}
}

// rule builds the expected Rule of TestParse with the defaults filled in.
func rule(line int, name, methods, path string, prefix bool, id Identity, limit int64, window time.Duration, edit ...func(*Rule)) *Rule {
	r := &Rule{Name: name, Line: line, Path: path, Prefix: prefix, Identity: id, Limit: limit, Window: window, Cost: 1}
	if methods != "*" {
		r.Methods = strings.Split(methods, ",")
	}
	for _, e := range edit {
		e(r)
	}
	return r
}

// setLine sets the Line of r and of its plans' rules, so that a rule
// parsed from another source compares equal.
func setLine(r *Rule, line int) {
	r.Line = line
	for _, p := range r.Plans {
		if p.rule != nil {
			p.rule.Line = line
		}
	}
}

// plans gives the rule of TestParse its plans, each with its rule as
// ForPlan returns it; it must come after every other edit.
func plans(claim string, ps ...Plan) func(*Rule) {
	return func(r *Rule) {
		r.PlanClaim = claim
		for i := range ps {
			ps[i].rule = r.planRule(ps[i].Limit, ps[i].Window)
		}
		r.Plans = ps
	}
}

// TestForPlan checks the rule a plan counts by: the plan's limit and
// window, a token rule's default burst following the plan and its own
// kept, a sliding rule's bucket kept when it divides the plan's window.
func TestForPlan(t *testing.T) {
	p := mustParse(t, `f: GET /a by jwt 100/1d cost=2 shadow count=all fail=closed plans(tier)=pro:10000/1d,fast:50/1s
s: GET /a by jwt 60/1m sliding(10s) plans(tier)=pro:600/1m,day:10000/1d,odd:7/7s
t: GET /a by jwt 10/1m token plans(tier)=pro:100/1m
tb: GET /a by jwt 10/1m token burst=20 plans(tier)=pro:100/1m`)
	tests := []struct {
		rule, plan     string
		limit          int64
		window, bucket time.Duration
		burst          int64
	}{
		{"f", "pro", 10000, 24 * time.Hour, 0, 0},
		{"f", "fast", 50, time.Second, 0, 0},
		{"f", "Pro", 100, 24 * time.Hour, 0, 0}, // names are case-sensitive
		{"f", "", 100, 24 * time.Hour, 0, 0},
		{"s", "pro", 600, time.Minute, 10 * time.Second, 0},
		{"s", "day", 10000, 24 * time.Hour, 10 * time.Second, 0},
		{"s", "odd", 7, 7 * time.Second, time.Second, 0}, // 10s does not divide 7s: DefaultBucket(7s)
		{"t", "pro", 100, time.Minute, 0, 100},           // the default burst follows the plan
		{"t", "free", 10, time.Minute, 0, 10},
		{"tb", "pro", 100, time.Minute, 0, 20}, // a burst of its own is kept
	}
	for _, tt := range tests {
		r, _ := p.Lookup(tt.rule)
		got := r.ForPlan(tt.plan)
		if got.Limit != tt.limit || got.Window != tt.window || got.Bucket != tt.bucket || got.Burst != tt.burst {
			t.Errorf("%s.ForPlan(%q) = %d/%v bucket %v burst %d, want %d/%v bucket %v burst %d",
				tt.rule, tt.plan, got.Limit, got.Window, got.Bucket, got.Burst, tt.limit, tt.window, tt.bucket, tt.burst)
		}
		if got.Name != r.Name || got.Identity != r.Identity || got.Cost != r.Cost || got.Shadow != r.Shadow ||
			got.CountAll != r.CountAll || got.Fail != r.Fail || got.Algorithm != r.Algorithm {
			t.Errorf("%s.ForPlan(%q) = %+v: not the rule's counting but for the plan", tt.rule, tt.plan, *got)
		}
		if (got == r) != (got.Limit == r.Limit && got.Window == r.Window && tt.plan != "pro" && tt.plan != "day" && tt.plan != "odd" && tt.plan != "fast") {
			t.Errorf("%s.ForPlan(%q) returned the rule itself: %v", tt.rule, tt.plan, got == r)
		}
		if got != r && (got.Plans != nil || got.PlanClaim != "") {
			t.Errorf("%s.ForPlan(%q) has plans of its own", tt.rule, tt.plan)
		}
		if r.ForPlan(tt.plan) != got {
			t.Errorf("%s.ForPlan(%q) is not the same rule twice", tt.rule, tt.plan)
		}
	}
	// A rule built by hand gets its plan's rule too.
	hand := &Rule{Name: "h", Limit: 1, Window: time.Second, Cost: 1, Plans: []Plan{{Name: "p", Limit: 5, Window: time.Minute}}}
	if got := hand.ForPlan("p"); got.Limit != 5 || got.Window != time.Minute || hand.Limit != 1 {
		t.Errorf("hand-built ForPlan = %+v", *got)
	}
	if n := testing.AllocsPerRun(100, func() { p.Rules()[0].ForPlan("fast") }); n > 1 { // Rules() clones its slice
		t.Errorf("ForPlan allocates %v times", n)
	}
}

func TestParse(t *testing.T) {
	ip := Identity{Kind: ByIP}
	sliding := func(b time.Duration) func(*Rule) {
		return func(r *Rule) { r.Algorithm, r.Bucket = Sliding, b }
	}
	token := func(burst int64) func(*Rule) {
		return func(r *Rule) { r.Algorithm, r.Burst = Token, burst }
	}
	tests := []struct {
		name string
		src  string
		want []*Rule
	}{
		{"empty", "", nil},
		{"comments and blank lines only", "# nothing\n\n   \n\t# more\n;;\n", nil},
		{"spec example", specExample, []*Rule{
			rule(2, "login", "POST", "/api/login", false, ip, 5, 15*time.Minute),
			rule(3, "register", "POST", "/api/register", false, ip, 3, time.Hour),
			rule(4, "reset", "POST", "/api/password-reset", false, Identity{ByEmail, "email"}, 3, time.Hour, sliding(time.Minute)),
			rule(5, "reset-ip", "POST", "/api/password-reset", false, ip, 5, time.Minute),
			rule(6, "send", "*", "/api/send-email", false, Identity{ByTenant, "X-Tenant-Id"}, 100, time.Hour),
			rule(7, "query", "GET,POST", "/api/query", false, Identity{ByTenant, "X-Tenant-Id"}, 1000, 24*time.Hour),
			rule(8, "global", "*", "/api", true, Identity{Kind: ByGlobal}, 1000, time.Minute, sliding(time.Second),
				func(r *Rule) { r.Fail = FailClosed }),
		}},
		{"semicolons, comments and CRLF", "a: GET /a by ip 1/1s; b: GET /b by ip 2/2s # c: GET /c by ip 1/1s\r\nd: GET /d by ip 3/3s;\r\n", []*Rule{
			rule(1, "a", "GET", "/a", false, ip, 1, time.Second),
			rule(1, "b", "GET", "/b", false, ip, 2, 2*time.Second),
			rule(2, "d", "GET", "/d", false, ip, 3, 3*time.Second),
		}},
		{"byte order mark", "\ufefflogin: POST /api/login by ip 5/15m", []*Rule{
			rule(1, "login", "POST", "/api/login", false, ip, 5, 15*time.Minute),
		}},
		{"no space after the colon", "login:POST /api/login by ip 5/15m", []*Rule{
			rule(1, "login", "POST", "/api/login", false, ip, 5, 15*time.Minute),
		}},
		{"methods upper-cased, extension methods", "m: get,Post,PURGE /x by ip 1/1s", []*Rule{
			rule(1, "m", "GET,POST,PURGE", "/x", false, ip, 1, time.Second),
		}},
		{"path in match form", "p: GET /API//v1/./x/../Login%3Bjsessionid=1/ by ip 1/1s", []*Rule{
			rule(1, "p", "GET", "/api/v1/login", false, ip, 1, time.Second),
		}},
		{"encoded path", "p: GET /a%2Fb/%7Euser/caf%C3%A9 by ip 1/1s", []*Rule{
			rule(1, "p", "GET", "/a/b/~user/café", false, ip, 1, time.Second),
		}},
		{"prefixes", "root: * /* by ip 1/1s; api: * /API/* by ip 1/1s; dot: * /a/../b/* by ip 1/1s", []*Rule{
			rule(1, "root", "*", "/", true, ip, 1, time.Second),
			rule(1, "api", "*", "/api", true, ip, 1, time.Second),
			rule(1, "dot", "*", "/b", true, ip, 1, time.Second),
		}},
		{"identities", `e: POST /a by email(user.login) 1/1s
t: POST /a by tenant(x-org-ID) 1/1s
h: POST /a by header(x-api-key) 1/1s
h2: POST /a by header(Authorization) 1/1s
g: POST /a by global 1/1s`, []*Rule{
			rule(1, "e", "POST", "/a", false, Identity{ByEmail, "user.login"}, 1, time.Second),
			rule(2, "t", "POST", "/a", false, Identity{ByTenant, "X-Org-Id"}, 1, time.Second),
			rule(3, "h", "POST", "/a", false, Identity{ByHeader, "X-Api-Key"}, 1, time.Second),
			rule(4, "h2", "POST", "/a", false, Identity{ByHeader, "Authorization"}, 1, time.Second),
			rule(5, "g", "POST", "/a", false, Identity{Kind: ByGlobal}, 1, time.Second),
		}},
		{"windows", "s: * /a by ip 1/90s; m: * /a by ip 1/15m; h: * /a by ip 1/2h; d: * /a by ip 1/7d; max: * /a by ip 1000000000000/3650d; z: * /a by ip 007/01m", []*Rule{
			rule(1, "s", "*", "/a", false, ip, 1, 90*time.Second),
			rule(1, "m", "*", "/a", false, ip, 1, 15*time.Minute),
			rule(1, "h", "*", "/a", false, ip, 1, 2*time.Hour),
			rule(1, "d", "*", "/a", false, ip, 1, 7*24*time.Hour),
			rule(1, "max", "*", "/a", false, ip, MaxCount, MaxWindow),
			rule(1, "z", "*", "/a", false, ip, 7, time.Minute),
		}},
		{"algorithms", `f: * /a by ip 10/1m fixed
s: * /a by ip 10/1h sliding
s2: * /a by ip 10/1h sliding(10m)
s3: * /a by ip 10/1h sliding(1h)
s4: * /a by ip 10/1m sliding(1s)
r: * /a by ip 10/1m reset
t: * /a by ip 10/1m token
t2: * /a by ip 10/1m burst=25 token cost=25`, []*Rule{
			rule(1, "f", "*", "/a", false, ip, 10, time.Minute),
			rule(2, "s", "*", "/a", false, ip, 10, time.Hour, sliding(time.Minute)),
			rule(3, "s2", "*", "/a", false, ip, 10, time.Hour, sliding(10*time.Minute)),
			rule(4, "s3", "*", "/a", false, ip, 10, time.Hour, sliding(time.Hour)),
			rule(5, "s4", "*", "/a", false, ip, 10, time.Minute, sliding(time.Second)),
			rule(6, "r", "*", "/a", false, ip, 10, time.Minute, func(r *Rule) { r.Algorithm = Reset }),
			rule(7, "t", "*", "/a", false, ip, 10, time.Minute, token(10)),
			rule(8, "t2", "*", "/a", false, ip, 10, time.Minute, token(25), func(r *Rule) { r.Cost = 25 }),
		}},
		{"every option, any order", "all: DELETE /a/* by header(X-Key) 5/1m count=all cost=5 shadow fail=local sliding(30s)", []*Rule{
			rule(1, "all", "DELETE", "/a", true, Identity{ByHeader, "X-Key"}, 5, time.Minute, sliding(30*time.Second), func(r *Rule) {
				r.CountAll, r.Cost, r.Shadow, r.Fail = true, 5, true, FailLocal
			}),
		}},
		{"fail modes", "o: * /a by ip 1/1s fail=open; c: * /a by ip 1/1s fail=closed; l: * /a by ip 1/1s fail=local", []*Rule{
			rule(1, "o", "*", "/a", false, ip, 1, time.Second, func(r *Rule) { r.Fail = FailOpen }),
			rule(1, "c", "*", "/a", false, ip, 1, time.Second, func(r *Rule) { r.Fail = FailClosed }),
			rule(1, "l", "*", "/a", false, ip, 1, time.Second, func(r *Rule) { r.Fail = FailLocal }),
		}},
		{"largest burst", "t: * /a by ip 1/1000d token burst=3", []*Rule{
			rule(1, "t", "*", "/a", false, ip, 1, 1000*24*time.Hour, token(3)),
		}},
		{"jwt identities", `a: GET /a by jwt 1/1s
b: GET /a by jwt(sub) 1/1s
c: GET /a by jwt(app_metadata.tenant_id) 1/1s
d: GET /a by jwt(https://example.com/org-id) 1/1s`, []*Rule{
			rule(1, "a", "GET", "/a", false, Identity{ByJWT, "sub"}, 1, time.Second),
			rule(2, "b", "GET", "/a", false, Identity{ByJWT, "sub"}, 1, time.Second),
			rule(3, "c", "GET", "/a", false, Identity{ByJWT, "app_metadata.tenant_id"}, 1, time.Second),
			rule(4, "d", "GET", "/a", false, Identity{ByJWT, "https://example.com/org-id"}, 1, time.Second),
		}},
		{"plans", `f: GET /a by jwt 100/1d plans(app_metadata.plan)=pro:10000/1d,team:50000/1d,Free-2.0:1/1s
s: GET /a by ip 60/1m sliding(10s) plans(tier)=pro:600/1m,day:10000/1d,odd:7/7s
t: GET /a by jwt 10/1m token plans(tier)=pro:100/1m
tb: GET /a by jwt 10/1m token burst=20 cost=5 plans(https://example.com/plan)=pro:100/1m,slow:20/1d`, []*Rule{
			rule(1, "f", "GET", "/a", false, Identity{ByJWT, "sub"}, 100, 24*time.Hour,
				plans("app_metadata.plan", Plan{Name: "pro", Limit: 10000, Window: 24 * time.Hour}, Plan{Name: "team", Limit: 50000, Window: 24 * time.Hour}, Plan{Name: "Free-2.0", Limit: 1, Window: time.Second})),
			rule(2, "s", "GET", "/a", false, ip, 60, time.Minute, sliding(10*time.Second),
				plans("tier", Plan{Name: "pro", Limit: 600, Window: time.Minute}, Plan{Name: "day", Limit: 10000, Window: 24 * time.Hour}, Plan{Name: "odd", Limit: 7, Window: 7 * time.Second})),
			rule(3, "t", "GET", "/a", false, Identity{ByJWT, "sub"}, 10, time.Minute, token(10),
				plans("tier", Plan{Name: "pro", Limit: 100, Window: time.Minute})),
			rule(4, "tb", "GET", "/a", false, Identity{ByJWT, "sub"}, 10, time.Minute, token(20), func(r *Rule) { r.Cost = 5 },
				plans("https://example.com/plan", Plan{Name: "pro", Limit: 100, Window: time.Minute}, Plan{Name: "slow", Limit: 20, Window: 24 * time.Hour})),
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse(tt.src)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.src, err)
			}
			got := p.Rules()
			if len(got) != len(tt.want) {
				t.Fatalf("Parse(%q) gave %d rules, want %d:\n%v", tt.src, len(got), len(tt.want), p)
			}
			for i := range got {
				if !reflect.DeepEqual(got[i], tt.want[i]) {
					t.Errorf("rule %d\n got: %+v\nwant: %+v", i, *got[i], *tt.want[i])
				}
			}
		})
	}
}

// TestRuleStringRoundTrip checks that a rule's String parses back to the
// same rule.
func TestRuleStringRoundTrip(t *testing.T) {
	src := specExample + `
t: get,HEAD /API/Caf%C3%A9/a%2520b/* by header(x-key) 10/90s token burst=30 cost=7 shadow count=all fail=open
e: POST /x%3Fy%23z%25 by email(user_name) 3/1d reset
u: * /* by tenant(X-Org) 1/1s
j: * /v1/* by jwt(app_metadata.tenant_id) 100/1d sliding plans(app_metadata.plan)=pro:10000/1d,team:50000/1d
k: * /v1/* by jwt 10/1m token plans(https://example.com/plan)=pro:100/1m
`
	p := mustParse(t, src)
	for _, r := range p.Rules() {
		q, err := Parse(r.String())
		if err != nil {
			t.Errorf("Parse(%q): %v", r.String(), err)
			continue
		}
		back := q.Rules()[0]
		setLine(back, r.Line)
		if !reflect.DeepEqual(back, r) {
			t.Errorf("%q parsed back as %+v, want %+v", r.String(), *back, *r)
		}
	}
	want := "global: * /api/* by global 1000/1m sliding(1s) fail=closed"
	if r, _ := p.Lookup("global"); r.String() != want {
		t.Errorf("String() = %q, want %q", r.String(), want)
	}
	want = "e: POST /x%3Fy%23z%25 by email(user_name) 3/1d reset"
	if r, _ := p.Lookup("e"); r.String() != want {
		t.Errorf("String() = %q, want %q", r.String(), want)
	}
	want = "j: * /v1/* by jwt(app_metadata.tenant_id) 100/1d sliding(24m) plans(app_metadata.plan)=pro:10000/1d,team:50000/1d"
	if r, _ := p.Lookup("j"); r.String() != want {
		t.Errorf("String() = %q, want %q", r.String(), want)
	}
	want = "k: * /v1/* by jwt 10/1m token burst=10 plans(https://example.com/plan)=pro:100/1m"
	if r, _ := p.Lookup("k"); r.String() != want {
		t.Errorf("String() = %q, want %q", r.String(), want)
	}
}

func TestParseWindow(t *testing.T) {
	tests := []struct {
		in      string
		want    time.Duration
		wantErr string
	}{
		{"1s", time.Second, ""},
		{"15m", 15 * time.Minute, ""},
		{"2h", 2 * time.Hour, ""},
		{"1d", 24 * time.Hour, ""},
		{"3650d", MaxWindow, ""},
		{"0s", 0, `window: expected from 1s to 3650d, got "0s"`},
		{"3651d", 0, `window: expected from 1s to 3650d, got "3651d"`},
		{"", 0, `window: expected Ns, Nm, Nh or Nd such as 15m, got ""`},
		{"15", 0, `window: expected Ns, Nm, Nh or Nd such as 15m, got "15"`},
		{"m", 0, `window: expected Ns, Nm, Nh or Nd such as 15m, got "m"`},
		{"1w", 0, `window: expected Ns, Nm, Nh or Nd such as 15m, got "1w"`},
		{"1ms", 0, `window: expected Ns, Nm, Nh or Nd such as 15m, got "1ms"`},
		{"+1s", 0, `window: expected Ns, Nm, Nh or Nd such as 15m, got "+1s"`},
	}
	for _, tt := range tests {
		got, err := ParseWindow(tt.in)
		var gotErr string
		if err != nil {
			gotErr = err.Error()
		}
		if got != tt.want || gotErr != tt.wantErr {
			t.Errorf("ParseWindow(%q) = %v, %q; want %v, %q", tt.in, got, gotErr, tt.want, tt.wantErr)
		}
	}
}

func TestFormatWindow(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want string
	}{
		{time.Second, "1s"},
		{90 * time.Second, "90s"},
		{15 * time.Minute, "15m"},
		{90 * time.Minute, "90m"},
		{time.Hour, "1h"},
		{36 * time.Hour, "36h"},
		{48 * time.Hour, "2d"},
		{1500 * time.Millisecond, "1.5s"},
		{0, "0s"},
	}
	for _, tt := range tests {
		if got := FormatWindow(tt.in); got != tt.want {
			t.Errorf("FormatWindow(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestDefaultBucket(t *testing.T) {
	tests := []struct {
		window, want time.Duration
	}{
		{time.Second, time.Second},
		{59 * time.Second, time.Second},
		{time.Minute, time.Second},
		{2 * time.Minute, 2 * time.Second},
		{125 * time.Second, time.Second}, // 2s does not divide 125s
		{7 * time.Minute, 7 * time.Second},
		{15 * time.Minute, 15 * time.Second},
		{time.Hour, time.Minute},
		{24 * time.Hour, 1440 * time.Second},
		{7919 * time.Second, time.Second},               // prime
		{1013 * 1009 * time.Second, 1013 * time.Second}, // only prime divisors, the larger one fits under /60
		{1009 * 60 * time.Second, 1009 * time.Second},
		{MaxWindow, 5256000 * time.Second}, // 3650d / 60
	}
	for _, tt := range tests {
		if got := DefaultBucket(tt.window); got != tt.want {
			t.Errorf("DefaultBucket(%v) = %v, want %v", tt.window, got, tt.want)
		}
	}
	for _, w := range []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond} {
		if got := DefaultBucket(w); got != w {
			t.Errorf("DefaultBucket(%v) = %v, want the window itself", w, got)
		}
	}
	// Against the definition, by brute force.
	for s := int64(1); s <= 100000; s += 37 {
		w := time.Duration(s) * time.Second
		want := int64(1)
		for d := int64(1); d <= max(1, s/60); d++ {
			if s%d == 0 {
				want = d
			}
		}
		if got := DefaultBucket(w); got != time.Duration(want)*time.Second {
			t.Fatalf("DefaultBucket(%v) = %v, want %ds", w, got, want)
		}
	}
}

// TestParseRLSErrors: rules for Envoy's rate limit service (rls:DOMAIN
// with descriptor(...)), one message per problem.
func TestParseRLSErrors(t *testing.T) {
	const badDescriptor = `identity: expected descriptor(key,key=value,...) on an rls: rule, with keys of [A-Za-z0-9_.-]+ and values without white space, commas or parentheses, got `
	expectParseErrors(t, []parseErrorCase{
		{"descriptor on an HTTP rule", "d: POST /api/login by descriptor(generic_key=login) 5/1m",
			`line 1: rule "d": identity: expected descriptor(...) only on a rule whose path is rls:DOMAIN, got "descriptor(generic_key=login)"`},
		{"HTTP identity on an rls rule", "d: * rls:edge by ip 5/1m",
			`line 1: rule "d": ` + badDescriptor + `"ip"`},
		{"methods on an rls rule", "d: POST rls:edge by descriptor(remote_address) 5/1m",
			`line 1: rule "d": methods: expected * on an rls: rule (descriptors have no method), got "POST"`},
		{"empty domain", "d: * rls: by descriptor(remote_address) 5/1m",
			`line 1: rule "d": path: expected rls:DOMAIN with a domain of [A-Za-z0-9_.-]+, got "rls:"`},
		{"bad domain", "d: * rls:a/b by descriptor(remote_address) 5/1m",
			`line 1: rule "d": path: expected rls:DOMAIN with a domain of [A-Za-z0-9_.-]+, got "rls:a/b"`},
		{"no keys", "d: * rls:edge by descriptor() 5/1m",
			`line 1: rule "d": ` + badDescriptor + `"descriptor()"`},
		{"empty key", "d: * rls:edge by descriptor(a,,b) 5/1m",
			`line 1: rule "d": ` + badDescriptor + `"descriptor(a,,b)"`},
		{"empty value", "d: * rls:edge by descriptor(generic_key=) 5/1m",
			`line 1: rule "d": ` + badDescriptor + `"descriptor(generic_key=)"`},
		{"key with a bad character", "d: * rls:edge by descriptor(a:b) 5/1m",
			`line 1: rule "d": ` + badDescriptor + `"descriptor(a:b)"`},
		{"value with a parenthesis", "d: * rls:edge by descriptor(k=(v)) 5/1m",
			`line 1: rule "d": ` + badDescriptor + `"descriptor(k=(v))"`},
		{"unclosed", "d: * rls:edge by descriptor(k 5/1m",
			`line 1: rule "d": ` + badDescriptor + `"descriptor(k"`},
		{"plans on an rls rule", "d: * rls:edge by descriptor(remote_address) 5/1m plans(plan)=pro:10/1m",
			`line 1: rule "d": plans: expected plans only on a rule whose path is an HTTP path (a descriptor has no token), got "plans(plan)=pro:10/1m"`},
		{"jwt on an rls rule", "d: * rls:edge by jwt 5/1m",
			`line 1: rule "d": ` + badDescriptor + `"jwt"`},
		{"every problem of an rls rule", "d: GET rls:a/b by descriptor 0/1m cost=2",
			strings.Join([]string{
				`line 1: rule "d": methods: expected * on an rls: rule (descriptors have no method), got "GET"`,
				`line 1: rule "d": path: expected rls:DOMAIN with a domain of [A-Za-z0-9_.-]+, got "rls:a/b"`,
				`line 1: rule "d": ` + badDescriptor + `"descriptor"`,
				`line 1: rule "d": limit: expected a count from 1 to 1000000000000, got "0/1m"`,
			}, "\n")},
	})
}

// TestParseRLS: an rls:DOMAIN rule keeps its domain and descriptor
// pattern, takes every option, and prints back as it parses.
func TestParseRLS(t *testing.T) {
	p := mustParse(t, `rls-login: * rls:edge by descriptor(generic_key=login,remote_address) 5/1m
t: * rls:Edge.v2 by descriptor(a=x=y,b,c=/p/q) 10/1h token burst=3 cost=2 shadow fail=closed count=all`)
	want := rule(1, "rls-login", "*", "", false, Identity{ByDescriptor, "generic_key=login,remote_address"}, 5, time.Minute, func(r *Rule) {
		r.Domain = "edge"
		r.Descriptor = []DescriptorEntry{{"generic_key", "login"}, {"remote_address", ""}}
	})
	if got := p.Rules()[0]; !reflect.DeepEqual(got, want) {
		t.Errorf("got  %+v\nwant %+v", *got, *want)
	}
	r := p.Rules()[1]
	if r.Domain != "Edge.v2" || !reflect.DeepEqual(r.Descriptor, []DescriptorEntry{{"a", "x=y"}, {"b", ""}, {"c", "/p/q"}}) {
		t.Errorf("rule t: domain %q, descriptor %+v", r.Domain, r.Descriptor)
	}
	for _, r := range p.Rules() {
		back := mustParse(t, r.String()).Rules()[0]
		back.Line = r.Line
		if !reflect.DeepEqual(back, r) {
			t.Errorf("%q parsed back as %+v, want %+v", r.String(), *back, *r)
		}
	}
	if s := p.Rules()[0].String(); s != "rls-login: * rls:edge by descriptor(generic_key=login,remote_address) 5/1m" {
		t.Errorf("String() = %q", s)
	}
}
