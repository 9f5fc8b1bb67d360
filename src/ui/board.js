// The deal board's drag and drop (SortableJS, served from /ui/sortable.js): dropping a card in
// another column picks that stage in the card's own form and submits it, so a drag is the same
// move as the keyboard's (src/ui/pages/deal-board.ts). Without this script the forms still work.
for (const list of document.querySelectorAll('[data-board] .board-cards')) {
  Sortable.create(list, {
    group: 'deals',
    sort: false,
    // Mouse and touch events rather than the browser's own drag and drop: the same on every device.
    forceFallback: true,
    filter: 'a, select, button, label',
    preventOnFilter: false,
    onAdd: (event) => {
      const form = event.item.querySelector('form.move')
      if (!form) return
      form.elements.stage.value = event.to.dataset.stage
      form.requestSubmit()
    },
  })
}
