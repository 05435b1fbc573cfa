// The sluice console: reads the admin API of the listener that served it
// (same origin only: the Content-Security-Policy allows nothing else) and
// updates itself every two seconds. Text from the API only ever becomes
// text: it is set with textContent, never parsed as HTML.
'use strict';

(() => {
  const STATS_EVERY = 2000; // ms between two reads of /v1/stats
  const RULES_EVERY = 10000; // ms between two reads of /v1/rules (a SIGHUP may change them)
  const TOKEN_KEY = 'sluice-admin-token';
  const KINDS = ['ip', 'email', 'tenant', 'header', 'key'];

  const $ = (id) => document.getElementById(id);
  const tokenRequired = document.body.dataset.token === 'required';
  let token = tokenRequired ? sessionStorage.getItem(TOKEN_KEY) : null;
  let rules = []; // as /v1/rules gives them
  let rulesRead = 0;
  let timer = null;
  let lastLookup = null; // the query of the key shown in the lookup

  // el makes an element with properties and children (strings become
  // text nodes).
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === 'class') e.className = v;
      else if (k.startsWith('data-')) e.setAttribute(k, v);
      else e[k] = v;
    }
    for (const c of children) e.append(c);
    return e;
  }

  class APIError extends Error {}

  // api calls the admin API with the token as a bearer header. A refused
  // token signs the operator out.
  async function api(method, path, body) {
    const headers = { Accept: 'application/json' };
    if (token) headers.Authorization = 'Bearer ' + token;
    const init = { method, headers, cache: 'no-store', credentials: 'omit', redirect: 'error' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    const res = await fetch(path, init);
    let data = null;
    if ((res.headers.get('Content-Type') || '').includes('json')) data = await res.json();
    if (res.status === 401 && tokenRequired) {
      signOut('The token was refused.');
      throw new APIError('the token was refused');
    }
    if (!res.ok) throw new APIError((data && (data.detail || data.title)) || res.status + ' ' + res.statusText);
    return data;
  }

  // --- signing in and out -------------------------------------------------

  function signOut(message) {
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    clearTimeout(timer);
    $('app').hidden = true;
    $('logout').hidden = true;
    $('login').hidden = false;
    $('login-error').textContent = message || '';
    $('token').value = '';
    $('token').focus();
  }

  $('login-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    token = $('token').value;
    $('token').value = '';
    $('login-error').textContent = '';
    start();
  });
  $('logout').addEventListener('click', () => signOut(''));

  async function start() {
    try {
      await loadRules();
    } catch (e) {
      if (tokenRequired) {
        signOut(e.message === 'the token was refused' ? 'The token was refused.' : e.message);
        return;
      }
      showError(e); // without a token there is nothing to sign in to: tick tries again
    }
    if (tokenRequired) sessionStorage.setItem(TOKEN_KEY, token);
    $('login').hidden = true;
    $('app').hidden = false;
    $('logout').hidden = !tokenRequired;
    $('readonly').hidden = tokenRequired;
    for (const b of document.querySelectorAll('#override-form button, #lookup-clear')) b.disabled = !tokenRequired;
    loadOverrides().catch(showError);
    tick();
  }

  function showError(e) {
    const b = $('error');
    b.textContent = e ? String(e.message || e) : '';
    b.hidden = !e;
  }

  // tick reads the stats (and now and then the rules) and schedules the
  // next read.
  async function tick() {
    clearTimeout(timer);
    try {
      await refresh();
      showError(null);
    } catch (e) {
      if (!token && tokenRequired) return; // signed out
      showError(e);
    }
    timer = setTimeout(tick, STATS_EVERY);
  }

  // refresh reads the stats, and the rules when they are due, once.
  async function refresh() {
    if (Date.now() - rulesRead > RULES_EVERY) await loadRules();
    renderStats(await api('GET', '/v1/stats'));
    if (usageQuery) await showUsage(usageQuery);
  }

  // --- rules --------------------------------------------------------------

  let rulesSeen = '';
  async function loadRules() {
    const data = await api('GET', '/v1/rules');
    rulesRead = Date.now();
    const seen = JSON.stringify(data.rules);
    if (seen === rulesSeen) return;
    rulesSeen = seen;
    rules = data.rules;
    renderRules();
  }

  function describeLimit(r) {
    const tags = [r.algorithm];
    if (r.shadow) tags.push('shadow');
    if (r.fail && r.fail !== 'default') tags.push('fail=' + r.fail);
    if (r.cost > 1) tags.push('cost=' + r.cost);
    if (r.tz) tags.push('tz=' + r.tz);
    if (r.anchor > 1) tags.push('anchor=' + r.anchor);
    if (r.charge) tags.push('charge=' + r.charge);
    return [r.limit + '/' + r.window, ...tags.map((t) => el('span', { class: 'tag' }, t))];
  }

  function renderRules() {
    const body = document.querySelector('#rules tbody');
    const rows = new Map([...body.rows].map((tr) => [tr.dataset.rule, tr]));
    const keep = new Set();
    for (const r of rules) {
      keep.add(r.name);
      let tr = rows.get(r.name);
      if (!tr) {
        tr = el('tr', { 'data-rule': r.name },
          el('td', { class: 'name' }), el('td', { class: 'match' }), el('td', { class: 'by' }), el('td', { class: 'limit' }),
          el('td', { class: 'num allowed' }, '–'), el('td', { class: 'num limited' }, '–'),
          el('td', { class: 'num share' }, '–'), el('td', { class: 'spark' }));
      }
      tr.cells[0].textContent = r.name;
      tr.cells[1].textContent = r.methods.join(',') + ' ' + r.path;
      tr.cells[2].textContent = r.identity + (r.field && r.identity !== 'email' ? '(' + r.field + ')' : '');
      tr.cells[3].replaceChildren(...describeLimit(r));
      body.append(tr); // in the order of the rules
    }
    for (const [name, tr] of rows) if (!keep.has(name)) tr.remove();
    fillRuleSelect($('lookup-rule'));
    fillRuleSelect($('override-rule'));
  }

  function fillRuleSelect(sel) {
    const current = sel.value;
    sel.replaceChildren(...rules.map((r) => el('option', { value: r.name }, r.name)));
    if (rules.some((r) => r.name === current)) sel.value = current;
    kindFor(sel);
  }

  // kindFor offers the identities a key of the selected rule can be
  // named by: the rule's own first, and nothing for a global rule.
  function kindFor(sel) {
    const kind = sel.id === 'lookup-rule' ? $('lookup-kind') : $('override-kind');
    const value = sel.id === 'lookup-rule' ? $('lookup-value') : $('override-value');
    const r = rules.find((x) => x.name === sel.value);
    const previous = kind.value;
    const own = r ? r.identity : 'ip';
    const kinds = own === 'global' ? ['global', 'key'] : [own, ...KINDS.filter((k) => k !== own)];
    kind.replaceChildren(...kinds.map((k) => el('option', { value: k }, k)));
    if (kinds.includes(previous) && sel.dataset.rule === sel.value) kind.value = previous;
    sel.dataset.rule = sel.value;
    value.disabled = kind.value === 'global';
  }
  for (const id of ['lookup', 'override']) {
    $(id + '-rule').addEventListener('change', (ev) => kindFor(ev.target));
    $(id + '-kind').addEventListener('change', (ev) => {
      $(id + '-value').disabled = ev.target.value === 'global';
    });
  }

  // --- live figures -------------------------------------------------------

  const fmtRate = (x) => (x === 0 ? '0' : x < 0.1 ? x.toFixed(2) : x < 10 ? x.toFixed(1) : Math.round(x).toLocaleString('en'));
  const fmtMs = (s) => { const ms = s * 1000; return (ms < 1 ? ms.toFixed(2) : ms < 10 ? ms.toFixed(1) : Math.round(ms)) + ' ms'; };
  const shortKey = (k) => k.slice(0, 12) + '…';

  // spark draws one bar per second, allowed below limited.
  function spark(allowed, limited) {
    const NS = 'http://www.w3.org/2000/svg';
    const w = 2, gap = 1, h = 22;
    const svg = document.createElementNS(NS, 'svg');
    svg.setAttribute('class', 'spark');
    svg.setAttribute('width', String(allowed.length * (w + gap)));
    svg.setAttribute('height', String(h));
    svg.setAttribute('role', 'img');
    const top = Math.max(1, ...allowed.map((a, i) => a + limited[i]));
    allowed.forEach((a, i) => {
      const l = limited[i];
      const ha = (a / top) * h, hl = (l / top) * h;
      for (const [cls, y, height] of [['a', h - ha, ha], ['l', h - ha - hl, hl]]) {
        if (height <= 0) continue;
        const r = document.createElementNS(NS, 'rect');
        r.setAttribute('class', cls);
        r.setAttribute('x', String(i * (w + gap)));
        r.setAttribute('y', String(y));
        r.setAttribute('width', String(w));
        r.setAttribute('height', String(Math.max(height, 1)));
        svg.append(r);
      }
    });
    const title = document.createElementNS(NS, 'title');
    title.textContent = 'checks per second over the last minute: allowed (blue) and limited (red)';
    svg.append(title);
    return svg;
  }

  function renderStats(s) {
    $('updated').textContent = 'updated ' + new Date(s.at).toLocaleTimeString('en-GB');
    $('window').textContent = '(rates over the last ' + Math.round(s.window_seconds) + ' s)';
    const body = document.querySelector('#rules tbody');
    for (const r of s.rules) {
      const tr = [...body.rows].find((x) => x.dataset.rule === r.rule);
      if (!tr) { rulesRead = 0; continue; } // a rule the table does not know yet: read the rules next time
      const d = r.decisions;
      const decided = d.allowed + d.limited;
      tr.querySelector('.allowed').textContent = fmtRate(r.allowed_per_second);
      tr.querySelector('.limited').textContent = fmtRate(r.limited_per_second);
      tr.querySelector('.share').textContent = decided ? Math.round((100 * d.limited) / decided) + '%' : '–';
      tr.classList.toggle('hot', d.limited > 0);
      tr.querySelector('.spark').replaceChildren(spark(r.allowed, r.limited));
      const extra = [];
      for (const o of ['shadow_limited', 'failed_open', 'failed_closed', 'local']) if (d[o] > 0) extra.push(o + ' ' + d[o]);
      if (r.charged_units !== undefined) {
        // A charge rule: what its responses charged over the window.
        extra.push('charged ' + r.charged_units.toLocaleString('en') + ' units');
        for (const [k, v] of Object.entries(r.charges || {})) if (v > 0) extra.push(k + ' ' + v);
        tr.querySelector('.limited').dataset.charged = String(r.charged_units);
      }
      tr.title = extra.length ? 'last minute: ' + extra.join(', ') : '';
    }
    renderStore(s.store);
    renderTop(s.top_limited, s.top_limited_minutes);
  }

  function chip(id, text, cls) {
    const c = $(id);
    c.textContent = text;
    c.className = 'chip ' + (cls || '');
  }

  function renderStore(st) {
    chip('store-kind', st.kind ? 'store: ' + st.kind : 'store');
    chip('ready', st.ready ? 'ready' : 'not ready', st.ready ? 'ok' : 'bad');
    const ready = $('store-ready');
    ready.textContent = st.ready ? 'yes: decisions are exact' : 'no: ' + (st.not_ready || 'the store does not answer');
    ready.className = st.ready ? 'ok' : 'bad';
    const br = $('store-breaker');
    br.textContent = st.breaker ? st.breaker.replace('_', '-') : 'none (the in-memory store needs none)';
    br.className = !st.breaker || st.breaker === 'closed' ? '' : st.breaker === 'open' ? 'bad' : 'warn';
    $('breaker').hidden = !st.breaker || st.breaker === 'closed';
    if (st.breaker) chip('breaker', 'breaker ' + st.breaker.replace('_', '-'), st.breaker === 'open' ? 'bad' : 'warn');
    const p = st.pool;
    $('store-pool').textContent = p ? p.acquired + ' in use, ' + p.idle + ' idle' + (p.constructing ? ', ' + p.constructing + ' opening' : '') + ' of ' + p.max : 'no pool (in-memory)';
    const l = st.latency_seconds;
    $('store-latency').textContent = l ? 'p50 ' + fmtMs(l.p50) + ' · p90 ' + fmtMs(l.p90) + ' · p99 ' + fmtMs(l.p99) : 'no store call in the last minute';
    const calls = $('store-calls');
    calls.textContent = st.calls.toLocaleString('en') + ' calls, ' + st.errors.toLocaleString('en') + ' errors in the last minute';
    calls.className = st.errors > 0 ? 'bad' : '';
  }

  function renderTop(top, minutes) {
    $('top-minutes').textContent = '(last ' + minutes + ' min)';
    const body = document.querySelector('#top tbody');
    body.replaceChildren(...top.map((t) => {
      const look = el('button', { type: 'button' }, 'Look up');
      look.addEventListener('click', () => lookupKey(t.rule, 'key', t.key));
      const reset = el('button', { type: 'button', class: 'danger', disabled: !tokenRequired }, 'Reset');
      reset.addEventListener('click', () => resetKey({ rule: t.rule, key: t.key }));
      return el('tr', { 'data-rule': t.rule, 'data-key': t.key, class: lastLookup && lastLookup.get('key') === t.key ? 'mark' : '' },
        el('td', {}, t.rule), el('td', { class: 'mono', title: t.key }, shortKey(t.key)),
        el('td', { class: 'num' }, (t.error ? '≤ ' : '') + t.count.toLocaleString('en')),
        el('td', { class: 'num' }, look, ' ', reset));
    }));
    $('top-empty').hidden = top.length > 0;
  }

  // --- key lookup and reset -----------------------------------------------

  // target is the query that names a key: the rule and one identity.
  function target(rule, kind, value) {
    const q = new URLSearchParams({ rule });
    if (kind !== 'global') q.set(kind, value);
    return q;
  }

  async function lookupKey(rule, kind, value) {
    $('lookup-rule').value = rule;
    kindFor($('lookup-rule'));
    $('lookup-kind').value = kind;
    $('lookup-value').value = kind === 'global' ? '' : value;
    $('lookup-value').disabled = kind === 'global';
    await showKey(target(rule, kind, value), '');
  }

  async function showKey(q, message) {
    $('lookup-message').textContent = '';
    try {
      const k = await api('GET', '/v1/keys?' + q);
      lastLookup = new URLSearchParams({ rule: k.rule, key: k.key });
      $('lookup-count').textContent = k.count + ' of ' + k.limit + ' per ' + k.window;
      $('lookup-remaining').textContent = String(k.remaining);
      $('lookup-reset').textContent = k.count === 0 ? 'nothing counted' : 'in ' + k.reset_after + ' s (' + new Date(k.reset * 1000).toLocaleTimeString('en-GB') + ')';
      $('lookup-key').textContent = k.key;
      $('lookup-result').hidden = false;
      $('lookup-message').textContent = message;
    } catch (e) {
      lastLookup = null;
      $('lookup-result').hidden = true;
      $('lookup-message').textContent = e.message;
    }
  }

  async function resetKey(which) {
    const q = new URLSearchParams(which);
    try {
      await api('DELETE', '/v1/keys?' + q);
      await showKey(q, 'Reset: the key starts again from zero on every instance.');
      refresh().catch(showError);
    } catch (e) {
      $('lookup-message').textContent = e.message;
    }
  }

  $('lookup').addEventListener('submit', (ev) => {
    ev.preventDefault();
    showKey(target($('lookup-rule').value, $('lookup-kind').value, $('lookup-value').value.trim()), '');
  });
  $('lookup-clear').addEventListener('click', () => {
    if (lastLookup) resetKey(Object.fromEntries(lastLookup));
  });

  // --- overrides ----------------------------------------------------------

  async function loadOverrides() {
    const data = await api('GET', '/v1/overrides');
    const body = document.querySelector('#overrides tbody');
    body.replaceChildren(...data.overrides.map((o) => {
      const edit = el('button', { type: 'button', disabled: !tokenRequired }, 'Change');
      edit.addEventListener('click', () => {
        $('override-rule').value = o.rule;
        kindFor($('override-rule'));
        $('override-kind').value = 'key';
        $('override-value').disabled = false;
        $('override-value').value = o.key;
        $('override-limit').value = String(o.limit);
        $('override-window').value = o.window;
        $('override-limit').focus();
      });
      const del = el('button', { type: 'button', class: 'danger', disabled: !tokenRequired }, 'Delete');
      del.addEventListener('click', async () => {
        try {
          await api('DELETE', '/v1/overrides?' + new URLSearchParams({ rule: o.rule, key: o.key }));
          $('override-message').textContent = 'Deleted: the key is back to its rule\'s limit.';
        } catch (e) {
          $('override-message').textContent = e.message;
        }
        loadOverrides().catch(showError);
      });
      return el('tr', { 'data-rule': o.rule, 'data-key': o.key },
        el('td', {}, o.rule), el('td', { class: 'mono', title: o.key }, shortKey(o.key)),
        el('td', {}, o.limit.toLocaleString('en') + '/' + o.window), el('td', { class: 'num' }, edit, ' ', del));
    }));
    $('overrides-empty').hidden = data.overrides.length > 0;
  }

  $('override-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const q = target($('override-rule').value, $('override-kind').value, $('override-value').value.trim());
    const body = { limit: Number($('override-limit').value), window: $('override-window').value.trim() };
    try {
      await api('PUT', '/v1/overrides?' + q, body);
      $('override-message').textContent = 'Saved: every instance applies it within seconds.';
      $('override-value').value = '';
    } catch (e) {
      $('override-message').textContent = e.message;
    }
    loadOverrides().catch(showError);
  });

  // --- usage ----------------------------------------------------------------

  // showUsage shows an identity's standing on every rule keyed by its kind
  // (GET /v1/usage), and keeps showing it: refresh reads it again.
  let usageQuery = null;

  function resetText(u) {
    if (u.count === 0) return 'nothing counted';
    return 'in ' + u.reset_after + ' s (' + new Date(u.reset * 1000).toLocaleTimeString('en-GB') + ')';
  }

  async function showUsage(q) {
    try {
      const data = await api('GET', '/v1/usage?' + q);
      usageQuery = q;
      const body = document.querySelector('#usage-table tbody');
      body.replaceChildren(...data.usage.map((u) => el('tr', { 'data-rule': u.rule, class: u.count > u.limit ? 'over' : '' },
        el('td', { class: 'name' }, u.rule),
        el('td', { class: 'num count' }, u.count.toLocaleString('en')),
        el('td', { class: 'num limit' }, u.limit.toLocaleString('en') + '/' + u.window),
        el('td', { class: 'num remaining' }, u.remaining.toLocaleString('en')),
        el('td', { class: 'reset' }, resetText(u)),
        el('td', { class: 'mono', title: u.key }, shortKey(u.key)))));
      $('usage-table').hidden = data.usage.length === 0;
      $('usage-message').textContent = data.usage.length ? '' : 'No rule counts by ' + q.keys().next().value + '.';
    } catch (e) {
      usageQuery = null;
      $('usage-table').hidden = true;
      $('usage-message').textContent = e.message;
    }
  }

  $('usage').addEventListener('submit', (ev) => {
    ev.preventDefault();
    showUsage(new URLSearchParams([[$('usage-kind').value, $('usage-value').value.trim()]]));
  });

  // --- start ---------------------------------------------------------------

  if (tokenRequired && !token) signOut('');
  else start();
})();
