// aioserve dashboard: draws frames (see aioserve/dashboard/frames.py), live from
// /ws/stats or replayed from an embedded list. No dependencies, no build step.
"use strict";
const AIOSERVE = (() => {
  const $ = (id) => document.getElementById(id);
  const history = [];  // tokens/s of recent frames, for the sparkline

  function hue(id) {
    let h = 0;
    for (let i = 0; i < id.length; i++) h = (h * 31 + id.charCodeAt(i)) >>> 0;
    return (h * 137.508) % 360;
  }
  const colour = (id) => `hsl(${hue(id).toFixed(0)}, 70%, 60%)`;
  const ms = (s) => (s * 1000).toFixed(s < 0.01 ? 2 : 0);
  const short = (id) => (id.length > 16 ? `${id.slice(0, 5)}…${id.slice(-9)}` : id);
  const pcts = (p) => (p ? `${ms(p.p50)} / ${ms(p.p90)} / ${ms(p.p99)} ms` : "–");

  function ensureSlots(n) {
    const box = $("slots");
    while (box.children.length > n) box.lastChild.remove();
    while (box.children.length < n) {
      const row = document.createElement("div");
      row.className = "slot";
      row.dataset.slot = String(box.children.length);
      row.innerHTML = `<span class="name">slot ${box.children.length}</span>` +
        `<div class="track"><div class="bar"></div><div class="pre"></div></div>` +
        `<span class="info"></span>`;
      box.appendChild(row);
    }
  }

  function drawSlot(row, s) {
    const bar = row.querySelector(".bar"), pre = row.querySelector(".pre");
    const info = row.querySelector(".info");
    if (!s) {
      row.dataset.requestId = ""; row.dataset.phase = "free";
      row.classList.remove("was-preempted");
      bar.style.width = "0"; pre.style.width = "0"; info.textContent = "free";
      return;
    }
    const [id, phase, prompt, output, computed, maxTokens, blocks, preempted, tenant,
      priority] = s;
    const total = Math.max(1, prompt + maxTokens);
    row.dataset.requestId = id; row.dataset.phase = phase;
    row.classList.toggle("was-preempted", preempted > 0);
    bar.style.background = colour(id);
    bar.style.width = `${(100 * Math.min(computed + 1, prompt + output)) / total}%`;
    pre.style.width = phase === "prefill" ? `${(100 * prompt) / total}%` : "0";
    info.innerHTML = "";
    const tag = document.createElement("span");
    tag.className = `phase ${phase}`; tag.textContent = phase;
    info.append(tag, `out ${output}/${maxTokens}  kv ${blocks}b `);
    if (preempted > 0) {
      const mark = document.createElement("span");
      mark.className = "preempted"; mark.textContent = `⟲${preempted} `;
      info.append(mark);
    }
    if (tenant != null || priority) info.append(`${tenant ?? "–"}·p${priority ?? 0} `);
    info.append(short(id));
    info.title = id;
  }

  function drawTenants(frame) {
    const box = $("tenants");
    box.innerHTML = "";
    for (const [tenant, running, waiting, ttft] of frame.tenants || []) {
      const row = document.createElement("div");
      row.className = "tenant";
      row.dataset.tenant = tenant ?? "";
      row.textContent = `${tenant ?? "(no tenant)"}: ${running} running, ${waiting} waiting, ` +
        `TTFT p50 / p99 ${ttft ? `${ms(ttft.p50)} / ${ms(ttft.p99)} ms` : "–"}`;
      box.appendChild(row);
    }
  }

  function drawReport(frame) {
    const box = $("policy-report");
    box.innerHTML = "";
    const num = (v) => (Math.abs(v) >= 100 ? v.toFixed(0) : v.toPrecision(3));
    for (const [name, value] of Object.entries(frame.policy_report || {})) {
      const row = document.createElement("div");
      row.className = "report";
      row.dataset.name = name;
      row.textContent = typeof value === "object"
        ? `${name}: ${Object.entries(value).map(([k, v]) => `${k} ${num(v)}`).join(", ") || "–"}`
        : `${name}: ${num(value)}`;
      box.appendChild(row);
    }
  }

  function drawQueue(frame) {
    const box = $("queue");
    box.innerHTML = "";
    for (const [id, preempted] of frame.waiting) {
      const chip = document.createElement("span");
      chip.className = "queued" + (preempted > 0 ? " was-preempted" : "");
      chip.dataset.requestId = id; chip.style.background = colour(id);
      chip.textContent = preempted > 0 ? `${short(id)} ⟲${preempted}` : short(id);
      chip.title = id;
      box.appendChild(chip);
    }
    const more = frame.num_waiting - frame.waiting.length;
    if (more > 0) {
      const tail = document.createElement("span");
      tail.id = "more"; tail.textContent = `+${more} more`;
      box.appendChild(tail);
    }
  }

  function drawSpark(tps) {
    history.push(tps);
    if (history.length > 120) history.shift();
    const top = Math.max(1, ...history);
    const pts = history.map((v, i) => `${i},${(28 - (26 * v) / top).toFixed(1)}`);
    $("spark-line").setAttribute("points", pts.join(" "));
  }

  function render(frame) {
    const running = frame.slots.filter((s) => s).length;
    const body = document.body;
    body.dataset.frames = String(Number(body.dataset.frames) + 1);
    body.dataset.step = String(frame.step);
    body.dataset.scheduler = frame.scheduler;
    $("model").textContent = frame.model;
    $("scheduler").textContent = frame.scheduler;
    $("step").textContent = frame.step;
    $("running").textContent = running;
    $("num-slots").textContent = frame.slots.length;
    $("waiting").textContent = frame.num_waiting;
    $("queue-count").textContent = frame.num_waiting;
    $("preemptions").textContent = frame.num_preemptions;
    const kv = frame.kv_total_blocks ? frame.kv_used_blocks / frame.kv_total_blocks : 0;
    $("kv").textContent = `${(100 * kv).toFixed(1)}%`;
    $("kv-bar").style.width = `${100 * kv}%`;
    $("kv-blocks").textContent =
      `${frame.kv_used_blocks} / ${frame.kv_total_blocks} blocks × ${frame.block_size} tokens`;
    $("tps").textContent = frame.tokens_per_s.toFixed(1);
    $("ttft").textContent = pcts(frame.ttft);
    $("itl").textContent = pcts(frame.itl);
    const refused = frame.refused || {};
    const full = refused.queue_full || 0, timeout = refused.queue_timeout || 0;
    $("refused").textContent = full + timeout;
    $("refused-full").textContent = full;
    $("refused-timeout").textContent = timeout;
    const limits = frame.admission || {};
    const parts = [];
    if (limits.max_waiting != null) parts.push(`max waiting ${limits.max_waiting}`);
    if (limits.max_queue_time_s != null) parts.push(`max queue ${limits.max_queue_time_s} s`);
    $("limits").textContent = parts.length ? parts.join(" · ") : "no limit";
    drawSpark(frame.tokens_per_s);
    ensureSlots(frame.slots.length);
    frame.slots.forEach((s, i) => drawSlot($("slots").children[i], s));
    drawQueue(frame);
    drawTenants(frame);
    drawReport(frame);
  }

  function setStatus(ok, text) {
    document.body.dataset.connected = String(ok);
    $("status").className = ok ? "ok" : "down";
    $("status").textContent = text;
  }

  // The key never goes in a URL: the form posts it once to /dashboard/login, which sets
  // an HttpOnly SameSite=Strict cookie; /dashboard/session says whether it still holds.
  // A refused or lost connection is retried with a doubling delay (at most a minute).
  const backoff = { delay: 1000, max: 60000, timer: null };

  function retryLater(text) {
    const wait = backoff.delay;
    backoff.delay = Math.min(backoff.max, backoff.delay * 2);
    setStatus(false, `${text}, retrying in ${Math.round(wait / 1000)} s…`);
    clearTimeout(backoff.timer);
    backoff.timer = setTimeout(live, wait);
  }

  function askForKey(message) {
    setStatus(false, "API key needed");
    const form = $("login");
    form.hidden = false;
    $("login-error").textContent = message;
    $("api-key").focus();
  }

  async function login(event) {
    event.preventDefault();
    const field = $("api-key");
    const response = await fetch("/dashboard/login", {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ api_key: field.value }),
    });
    field.value = "";
    if (response.ok) {
      $("login").hidden = true;
      backoff.delay = 1000;
      live();
    } else {
      askForKey(response.status === 401 ? "wrong key" : `refused (${response.status})`);
    }
  }

  async function live() {
    $("login").onsubmit = login;
    let response;
    try {
      response = await fetch("/dashboard/session", { credentials: "same-origin" });
    } catch (error) {
      retryLater("server unreachable");
      return;
    }
    if (response.status === 401) { askForKey(""); return; }  // no retry until the form
    if (!response.ok) { retryLater(`refused (${response.status})`); return; }
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${proto}//${location.host}/ws/stats`);
    ws.onopen = () => { backoff.delay = 1000; setStatus(true, "live"); };
    ws.onmessage = (event) => {
      const frame = JSON.parse(event.data);
      if (frame.type === "frame") render(frame);
    };
    ws.onclose = () => retryLater("disconnected");
  }

  // runs: {policy name: [frame, ...]}; the slider moves through the chosen policy's
  // steps, and switching policy keeps the moment of virtual time.
  function replay(runs) {
    document.body.classList.add("replay");
    const names = Object.keys(runs);
    const slider = $("slider"), select = $("policy");
    let frames = runs[names[0]] || [], timer = null;
    for (const name of names) select.add(new Option(`${name} (${runs[name].length} steps)`, name));
    const show = (i) => {
      const frame = frames[i];
      if (!frame) return;
      document.body.dataset.policy = select.value;
      $("clock").textContent = `t = ${frame.time.toFixed(3)} s`;
      render(frame);
    };
    const choose = (name) => {
      const time = frames.length ? frames[Number(slider.value)].time : 0;
      frames = runs[name];
      history.length = 0;
      slider.max = String(Math.max(0, frames.length - 1));
      let i = frames.findIndex((f) => f.time >= time);
      if (i < 0) i = frames.length - 1;
      slider.value = String(Math.max(0, i));
      setStatus(true, `replay: ${name}`);
      show(Number(slider.value));
    };
    select.onchange = () => choose(select.value);
    slider.oninput = () => show(Number(slider.value));
    $("play").onclick = () => {
      if (timer) { clearInterval(timer); timer = null; $("play").textContent = "▶ play"; return; }
      $("play").textContent = "❚❚ pause";
      timer = setInterval(() => {
        const next = Number(slider.value) + 1;
        if (next >= frames.length) {
          clearInterval(timer); timer = null; $("play").textContent = "▶ play"; return;
        }
        slider.value = String(next); show(next);
      }, 100);
    };
    slider.value = "0";
    if (names.length) choose(names[0]);
  }

  return { render, live, replay };
})();
