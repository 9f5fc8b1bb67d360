// Progressive enhancement only: copy buttons for values shown once. Every form works without it.
for (const button of document.querySelectorAll('button[data-copy]')) button.hidden = false
document.addEventListener('click', async (event) => {
  const button = event.target instanceof Element ? event.target.closest('button[data-copy]') : null
  if (!button) return
  const field = document.getElementById(button.dataset.copy)
  if (!field) return
  const text = field instanceof HTMLInputElement ? field.value : field.innerText
  try {
    await navigator.clipboard.writeText(text)
  } catch {
    if (field instanceof HTMLInputElement) field.select()
    document.execCommand('copy')
  }
  const status = document.getElementById(button.dataset.copy + '-status')
  if (status) status.textContent = 'Copied to the clipboard'
  button.textContent = 'Copied'
})
