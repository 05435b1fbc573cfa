package main

// scenario is one row group of the table: the rules sluice runs and the
// request mix wrk sends to every target.
type scenario struct {
	id    string
	title string
	rules string // SLUICE_RULES
	mix   mix
	// exhaust, when positive, is the limit of the bad IPs' rule: before
	// measuring, each bad IP sends exhaust+1 requests, so that it starts
	// over its limit and its denials come from the over-limit LRU.
	exhaust int
	// burst, when positive, makes this a burst scenario (burst.go) on a
	// limit of burst: no wrk, no mix, and a table of its own.
	burst int
}

// Limits far above what a run can send keep scenarios 1 to 3 under their
// limits. Scenario 4's window is a day so that no window boundary (fixed
// windows are aligned to the epoch) lifts the bad IPs' limit mid-run.
var scenarios = []scenario{
	{
		id:    "1",
		title: "10k client IPs, `ip` rule",
		rules: "ip: * /api/* by ip 1000000/1h",
		mix:   mix{GoodIPs: 10000},
	},
	{
		id:    "2",
		title: "one hot `global` key",
		rules: "global: * /api/* by global 1000000000/1h",
	},
	{
		id:    "3",
		title: "`global` + `ip` + `tenant`",
		rules: "global: * /api/* by global 1000000000/1h; ip: * /api/* by ip 1000000/1h; tenant: * /api/* by tenant 1000000000/1h",
		mix:   mix{GoodIPs: 10000, Tenants: 8},
	},
	{
		id:      "4",
		title:   "95% from over-limit IPs",
		rules:   "ip: * /api/* by ip 10/1d",
		mix:     mix{GoodIPs: 10000, BadIPs: 1000, BadShare: 19},
		exhaust: 10,
	},
	{
		id:    "5",
		title: "burst: 1,000 at once on one key, three instances",
		rules: "ip: * /api/* by ip 100/1h",
		burst: 100,
	},
}
