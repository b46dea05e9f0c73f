// The assistant: a chat that streams the answer as it arrives, with the published system prompt.
import { api, postStream } from '../api.js';
import { fill, h, notice } from '../dom.js';

export async function render(main) {
  const published = (await api('GET', '/v1/assistant/system-prompt', undefined, { org: false })).data;
  const history = [{ role: 'system', content: published.system_prompt }];
  const log = h('ol', { id: 'chat', class: 'chat', 'aria-live': 'polite' });
  const question = h('textarea', { name: 'question', rows: 2, required: true, maxlength: published.limits.max_characters });
  const status = h('div', {});
  const send = h('button', { type: 'submit' }, 'Ask');
  const form = h('form', { id: 'chat-form' }, h('label', { class: 'field' }, h('span', {}, 'Ask about your fleet'), question), send, status);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const text = question.value.trim();
    if (!text) return;
    question.value = '';
    notice(status, '');
    history.push({ role: 'user', content: text });
    log.append(h('li', { class: 'user' }, text));
    const answer = h('li', { class: 'assistant' });
    log.append(answer);
    send.disabled = true;
    try {
      await postStream('/v1/assistant/chat/completions', { model: 'default', messages: history, stream: true }, (chunk) => {
        const delta = chunk?.choices?.[0]?.delta?.content;
        if (typeof delta === 'string') answer.append(document.createTextNode(delta));
      });
      history.push({ role: 'assistant', content: answer.textContent });
    } catch (err) {
      answer.remove();
      history.pop();
      notice(status, err.message, 'error');
    } finally { send.disabled = false; question.focus(); }
  });
  fill(main, h('div', { class: 'title' }, h('h1', {}, 'Assistant')), log, form);
  question.focus();
}
