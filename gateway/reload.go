package gateway

import (
	"errors"
	"reflect"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/sluicehq/sluice/policy"
)

// errNoRulesFile is reloadRules' answer when the rules come from
// SLUICE_RULES: the environment of a running process cannot change, so
// there is nothing to read again.
var errNoRulesFile = errors.New("nothing to reload: the rules come from SLUICE_RULES, not SLUICE_RULES_FILE")

// newReloadsCounter registers a counter of reloads by result (name, with
// help), with both results, ok and error, present from the start.
func newReloadsCounter(reg prometheus.Registerer, name, help string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"result"})
	c.WithLabelValues("ok")
	c.WithLabelValues("error")
	reg.MustRegister(c)
	return c
}

// reload is SIGHUP: it reads SLUICE_RULES_FILE again (reloadRules),
// SLUICE_JWT_JWKS_FILE (jwt.Verifier.Reload) and the TLS files
// (reloadTLS), each on its own: a file that fails keeps what is running
// of it in force, logs and counts why, and never stops the others from
// being read.
func (g *Gateway) reload() {
	jwks := g.jwt != nil && g.cfg.JWTJWKSFile != ""
	switch {
	case g.cfg.RulesFile != "":
		g.reloadRules() //nolint:errcheck // logged and counted
	case jwks:
		g.log.Info("SIGHUP: the rules come from SLUICE_RULES; only SLUICE_JWT_JWKS_FILE is read again, with the TLS files when set")
	case g.cfg.certs != nil:
		// SIGHUP is for the TLS files alone: nothing to warn about.
	default:
		g.log.Warn("SIGHUP: " + errNoRulesFile.Error() + ", and there is no SLUICE_JWT_JWKS_FILE")
	}
	if jwks {
		// A failure is logged and counted by the verifier
		// (sluice_jwt_jwks_refreshes_total); the last good key set stays.
		if err := g.jwt.Reload(); err == nil {
			g.log.Info("JWKS file reloaded", zap.String("jwks_file", g.cfg.JWTJWKSFile))
		}
	}
	g.reloadTLS() //nolint:errcheck // logged and counted
}

// reloadRules reads SLUICE_RULES_FILE again and puts its rules in force,
// all at once: a request already being served finishes under the rules it
// started with, the next one is decided under the new ones (see
// proxy.Proxy.SetPolicy), and the admin API shows them. Rules that do not
// parse are refused whole: the running rules stay, and the problems are
// logged and counted. The over-limit fast path needs no flush: it drops a
// denial made under another definition of a rule at its next lookup.
// Rules that need a token are refused, as at start-up, when no
// SLUICE_JWT_* setting gives keys (see loadRules).
func (g *Gateway) reloadRules() error {
	if g.cfg.RulesFile == "" {
		return errNoRulesFile
	}
	pol, problems := loadRules(g.cfg.settings)
	if len(problems) > 0 {
		g.reloads.WithLabelValues("error").Inc()
		err := &configError{problems: problems}
		g.log.Error("rules not reloaded: the running rules stay",
			zap.String("rules_file", g.cfg.RulesFile), zap.Strings("problems", problems))
		return err
	}
	old := g.dec.Policy()
	g.dec.SetPolicy(pol)
	g.reloads.WithLabelValues("ok").Inc()
	added, changed, removed := diffRules(old, pol)
	g.log.Info("rules reloaded", zap.String("rules_file", g.cfg.RulesFile), zap.Int("rules", pol.Len()),
		zap.Strings("added", added), zap.Strings("changed", changed), zap.Strings("removed", removed))
	return nil
}

// diffRules names the rules of next that old lacks, those whose
// definition differs, and those of old that next lacks.
func diffRules(old, next *policy.Policy) (added, changed, removed []string) {
	for _, r := range next.Rules() {
		prev, ok := old.Lookup(r.Name)
		switch {
		case !ok:
			added = append(added, r.Name)
		case !sameRule(prev, r):
			changed = append(changed, r.Name)
		}
	}
	for _, r := range old.Rules() {
		if _, ok := next.Lookup(r.Name); !ok {
			removed = append(removed, r.Name)
		}
	}
	return added, changed, removed
}

// sameRule reports whether a and b are the same rule, wherever they stand
// in their sources.
func sameRule(a, b *policy.Rule) bool {
	x, y := *a, *b
	x.Line, y.Line = 0, 0
	return reflect.DeepEqual(x, y)
}

// newTLSCollectors registers sluice_tls_reloads_total{result} and
// sluice_tls_certificate_expiry_seconds, when the certificate in force
// expires, for an alert before it does.
func newTLSCollectors(reg prometheus.Registerer, certs *certificates) *prometheus.CounterVec {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_tls_certificate_expiry_seconds",
		Help: "When the TLS certificate in force expires, in Unix seconds.",
	}, func() float64 { return float64(certs.notAfter().Unix()) }))
	return newReloadsCounter(reg, "sluice_tls_reloads_total",
		"Reloads of the SLUICE_TLS_* files (on SIGHUP) by result: ok (new handshakes get them) or error (the running certificates stay).")
}

// reloadTLS reads the TLS files again (see certificates.reload): new
// handshakes get the new certificates, open connections keep theirs. Files
// that cannot be read or parsed are refused: the running certificates
// stay, and the problem is logged and counted. Without TLS it does
// nothing.
func (g *Gateway) reloadTLS() error {
	if g.cfg.certs == nil {
		return nil
	}
	if err := g.cfg.certs.reload(); err != nil {
		g.tlsLoads.WithLabelValues("error").Inc()
		g.log.Error("TLS files not reloaded: the running certificates stay", zap.Error(err))
		return err
	}
	g.tlsLoads.WithLabelValues("ok").Inc()
	g.log.Info("TLS files reloaded", zap.Time("not_after", g.cfg.certs.notAfter()))
	return nil
}
