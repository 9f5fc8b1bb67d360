// `make links` (part of `make check`): every link between the project's Markdown files, and from
// them to its other files, must name a file that exists and, with #, a heading that exists there.
// Local files only: no request leaves the machine (repository: false, so links to the project's
// GitHub pages are not taken for local ones either).
import remarkValidateLinks from 'remark-validate-links'

export default {
  plugins: [[remarkValidateLinks, { repository: false }]],
}
